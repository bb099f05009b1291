"""Where beam search spends its time: the model, and `generate`'s own bookkeeping.

1. A/B, interleaved in one process: our model against the same model whose beam-search cache handling is the
   first session's (decoder keys and values reordered, the encoder-decoder ones kept one row per beam and never
   copied), i.e. without grouping those once per sentence (change 3 in docs/BENCHMARKS.md).
2. `generate` with a stand-in model that returns fixed logits and does nothing else (the encoder still runs):
   the cost of `generate`'s beam search itself, which every PyTorch model pays and CTranslate2 does not.

Same work as benchmarks/speed.py's generation rows: sources of 16-32 tokens, exactly 32 new tokens, no end token.

Usage:
    python benchmarks/beam_search.py                       # small and base, batch 32, beam 4
    python benchmarks/beam_search.py --presets small --batch 1 --repetitions 15
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import WORKLOADS, build_ours, fix_malloc_thresholds, generation, padded_batch  # noqa: E402
from timing import median_seconds  # noqa: E402

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402


class OursUngrouped(VanillaTransformerForConditionalGeneration):
    """Our model with the first session's beam-search cache handling: the encoder-decoder keys and values stay one
    row per beam (not copied unless some beam changed sentence, checked on one head of one layer)."""

    def _reorder_cache(self, past_key_values, beam_idx):
        past_key_values.self_attention_cache.reorder_cache(beam_idx)
        cross_attention_cache = past_key_values.cross_attention_cache
        if cross_attention_cache.get_seq_length() > 0:
            keys = cross_attention_cache.layers[0].keys[:, 0]
            if not torch.equal(keys.index_select(0, beam_idx), keys):
                cross_attention_cache.reorder_cache(beam_idx)
        return past_key_values


class StandIn(VanillaTransformerForConditionalGeneration):
    """Returns the same random logits every step and computes nothing else."""

    def forward(self, decoder_input_ids=None, past_key_values=None, **kwargs):
        rows = decoder_input_ids.shape[0]
        if getattr(self, "fixed_logits", None) is None or self.fixed_logits.shape[0] != rows:
            self.fixed_logits = torch.randn(rows, 1, self.config.vocab_size)
        if past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return Seq2SeqLMOutput(logits=self.fixed_logits.clone(), past_key_values=past_key_values)

    def _reorder_cache(self, past_key_values, beam_idx):
        return past_key_values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=7)
    args = parser.parse_args()
    fix_malloc_thresholds()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {torch.get_num_threads()} threads")
    for preset in args.presets:
        workload = WORKLOADS[preset]
        batch = padded_batch(workload.vocab_size, args.batch, workload.source_lengths, (1, 1), seed=2)
        ours = build_ours(preset, workload.vocab_size).eval()
        models = {"ours": ours, "ungrouped": OursUngrouped(ours.config).eval(), "stand-in": StandIn(ours.config)}
        for model in models.values():
            model.load_state_dict(ours.state_dict())
        new_tokens = workload.new_tokens
        runs = {name: generation(model, batch, args.beams, new_tokens) for name, model in models.items()}
        seconds = median_seconds(runs, args.repetitions)
        tokens = args.batch * new_tokens
        print(
            f"{preset} beam {args.beams} batch {args.batch}: ours {tokens / seconds['ours']:,.0f} tok/s, "
            f"ungrouped {tokens / seconds['ungrouped']:,.0f} tok/s, ours/ungrouped "
            f"{seconds['ungrouped'] / seconds['ours']:.3f}x; generate with the stand-in model "
            f"{seconds['stand-in'] * 1000:.0f} ms = {seconds['stand-in'] / seconds['ours']:.0%} of ours "
            f"({seconds['ours'] * 1000:.0f} ms)"
        )


if __name__ == "__main__":
    main()
