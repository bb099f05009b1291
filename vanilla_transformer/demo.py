"""A web page that translates with a saved model and shows its attention: the demo, and a Hugging Face Space's app.

    pip install "vanilla-transformer[demo]"
    vanilla-transformer demo outputs/vanilla-transformer       # a model folder
    vanilla-transformer demo your-name/vanilla-en-de           # or a model on the Hub
    GRADIO_SERVER_PORT=8080 GRADIO_SERVER_NAME=0.0.0.0 vanilla-transformer demo MODEL   # Gradio's own settings apply

In a Space (`vanilla-transformer space` writes one), the model comes from the MODEL_ID variable of the Space's
settings, else from the `models:` list of the Space's card (`space_model`).

The page translates one sentence per line, all lines as one batch, with the beam size and length penalty of the
model's generation_config.json as defaults, and draws the attention weights of one layer and head as the
attention-map command does. The same translation is an API endpoint:

    from gradio_client import Client
    Client("http://127.0.0.1:7860/").predict("The house is small.", api_name="/translate")   # num_beams=, length_penalty=
"""

import io
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from vanilla_transformer.attention_maps import ATTENTION_KINDS, compute_attentions, plot_attention_grid
from vanilla_transformer.translate import CommandLineError, load_model_and_tokenizer, translate_sentences

MAX_LINES = 32  # lines per request: one batch, translated on a CPU in seconds
KINDS = {title: kind for kind, (_, title, _, _) in ATTENTION_KINDS.items()}  # "Encoder self-attention" -> output name
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "cs": "Czech", "ro": "Romanian"}


class InputError(ValueError):
    """Input the demo refuses (too long, too many lines), with a message for the page."""


@dataclass
class Translator:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source_lang: str
    target_lang: str

    @property
    def max_source_tokens(self) -> int:
        return self.model.config.max_position_embeddings

    def default(self, setting: str, fallback):
        value = getattr(self.model.generation_config, setting, None)
        return fallback if value is None else value


def model_folder(name: str) -> Path:
    """`name` as a local model folder, or the Hub model of that id downloaded (cached) into one."""
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name))
    except Exception as error:  # noqa: BLE001 - an invalid id, offline, unreachable, unknown: the page says which
        raise CommandLineError(
            f"{name} is neither a folder here nor a model the Hub gave ({type(error).__name__}: {error})"
        ) from error


def card_languages(folder: Path) -> tuple[str, str]:
    """The source and target language of the model card's `language:` list; "source"/"target" if it has none."""
    from huggingface_hub import metadata_load

    languages = (metadata_load(folder / "README.md") or {}).get("language") if (folder / "README.md").is_file() else []
    languages = languages if isinstance(languages, list) and len(languages) == 2 else ["source", "target"]
    return languages[0], languages[1]


def load_translator(name: str) -> Translator:
    """The model and tokenizer of a folder or Hub id, with eager attention (it returns the weights to draw);
    CommandLineError says why when they cannot be loaded."""
    folder = model_folder(name)
    model, tokenizer = load_model_and_tokenizer(folder, attn_implementation="eager")
    return Translator(model, tokenizer, name, *card_languages(folder))


def translate_text(translator: Translator, text: str, num_beams: int, length_penalty: float) -> str:
    """Each line of `text` translated, all lines as one batch; line i of the result translates line i.
    InputError refuses too many lines or a line longer than the model's positions."""
    if int(num_beams) < 1 or not 0 <= float(length_penalty) <= 10:
        raise InputError(f"Beam size {num_beams} or length penalty {length_penalty} is out of range (1+, 0-10).")
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise InputError(f"The input has {len(lines)} lines; the demo translates at most {MAX_LINES} at a time.")
    lengths = [len(ids) for ids in translator.tokenizer(lines)["input_ids"]] if lines else []
    too_long = [number for number, length in enumerate(lengths, start=1) if length > translator.max_source_tokens]
    if too_long:
        raise InputError(
            f"Line {too_long[0]} is too long: {lengths[too_long[0] - 1]} tokens, and the model reads at most "
            f"{translator.max_source_tokens}. Split it into shorter sentences, one per line."
        )
    settings = {"length_penalty": float(length_penalty)} if int(num_beams) > 1 else {}
    translations = translate_sentences(
        translator.model,
        translator.tokenizer,
        lines,
        batch_size=max(len(lines), 1),
        num_beams=int(num_beams),
        **settings,
    )
    return "\n".join(" ".join(translation.splitlines()) for translation in translations)


def attention_image(translator: Translator, source: str, translation: str, kind_title: str, layer: int, head: int):
    """A PIL image of one layer's and head's attention weights of `kind_title` (a title in ATTENTION_KINDS) over the
    tokens of `source` and its `translation`, drawn by the attention-map command's plot_attention_grid."""
    from PIL import Image

    kind = KINDS[kind_title]
    attentions = compute_attentions(translator.model, translator.tokenizer, source, target=translation)
    weights = attentions[kind]
    layers, heads = weights.shape[:2]
    if not (1 <= layer <= layers and 1 <= head <= heads):
        raise InputError(f"{kind_title} has {layers} layers of {heads} heads: pick a layer and head within them.")
    _, title, query_side, key_side = ATTENTION_KINDS[kind]
    figure = plot_attention_grid(
        weights[layer - 1 : layer, head - 1 : head], attentions[query_side], attentions[key_side], title
    )
    figure.axes[0].set_title(f"layer {layer}, head {head}", fontsize=8)  # the grid numbers its one map 1, 1
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=150)
    return Image.open(io.BytesIO(buffer.getvalue()))


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def respond(translator: Translator, text: str, num_beams, length_penalty, show: bool, kind: str, layer, head):
    """The page's answer to a click: (translation, attention image or None, message); nothing for an empty box."""
    import gradio as gr

    if not text.strip():
        return gr.skip(), gr.skip(), gr.skip()
    try:
        translated = translate_text(translator, text, num_beams, length_penalty)
        image = None
        if show:
            pairs = zip(text.splitlines(), translated.split("\n"), strict=True)
            source, translation = next(pair for pair in pairs if pair[0].strip())
            image = attention_image(translator, source, translation, kind, int(layer), int(head))
    except InputError as error:
        return "", None, f"**{error}**"
    return translated, image, ""


def failed_page(error: Exception):
    import gradio as gr

    with gr.Blocks(title="vanilla-transformer demo") as demo:
        gr.Markdown(f"# vanilla-transformer\n\n**The model could not be loaded.** {error}", elem_id="message")
    return demo


def build_demo(name: str):
    """The Gradio page for the model `name`; if it cannot be loaded, a page that says why."""
    import gradio as gr

    try:
        translator = load_translator(name)
    except CommandLineError as error:
        print(f"error: {error}", file=sys.stderr)
        return failed_page(error)
    config = translator.model.config
    source, target = language_name(translator.source_lang), language_name(translator.target_lang)
    with gr.Blocks(title=f"vanilla-transformer: {name}") as demo:
        gr.Markdown(
            f"# vanilla-transformer: {name}\n\nThe Transformer of *Attention Is All You Need* (2017), translating "
            f"{source} to {target}. One sentence per line; all lines translate as one batch."
        )
        with gr.Row():
            with gr.Column():
                text = gr.Textbox(label=f"Source ({source})", lines=4, max_lines=MAX_LINES, elem_id="source")
                with gr.Row():
                    num_beams = gr.Slider(1, 16, step=1, value=translator.default("num_beams", 4), label="Beam size")
                    penalty = translator.default("length_penalty", 0.6)
                    length_penalty = gr.Slider(0, 2, step=0.05, value=penalty, label="Length penalty")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
            with gr.Column():
                translation = gr.Textbox(
                    label=f"Translation ({target})", lines=4, interactive=False, elem_id="translation"
                )
                message = gr.Markdown(elem_id="message")
        with gr.Accordion("Attention maps", open=False):
            show = gr.Checkbox(label="Draw the attention of the first line", elem_id="show_attention")
            with gr.Row():
                kind = gr.Radio(list(KINDS), value=next(iter(KINDS)), label="Attention", elem_id="kind")
                layers = max(config.encoder_layers, config.decoder_layers)
                heads = max(config.encoder_attention_heads, config.decoder_attention_heads)
                layer = gr.Slider(1, layers, step=1, value=1, label="Layer", elem_id="layer")
                head = gr.Slider(1, heads, step=1, value=1, label="Head", elem_id="head")
            image = gr.Image(label="Attention weights", type="pil", format="png", elem_id="attention")
        inputs = [text, num_beams, length_penalty, show, kind, layer, head]
        outputs = [translation, image, message]
        button.click(partial(respond, translator), inputs, outputs, api_visibility="private", concurrency_id="model")
        gr.api(api_endpoint(translator), api_name="translate", concurrency_id="model")
    return demo


def api_endpoint(translator: Translator):
    """The /translate endpoint: text in (one sentence per line), translation out; the decoding settings optional,
    with the model's defaults."""
    import gradio as gr

    def translate(
        text: str,
        num_beams: int = int(translator.default("num_beams", 4)),
        length_penalty: float = float(translator.default("length_penalty", 0.6)),
    ) -> str:
        """Translate `text`, one sentence per line, all lines as one batch."""
        if not text.strip():
            return ""
        try:
            return translate_text(translator, text, num_beams, length_penalty)
        except InputError as error:
            raise gr.Error(str(error)) from error

    return translate


def space_model(card: Path) -> str | None:
    """The model a Space serves: $MODEL_ID (the Space's settings), else the first of `models:` in its card."""
    if os.environ.get("MODEL_ID"):
        return os.environ["MODEL_ID"]
    if card.is_file():
        from huggingface_hub import metadata_load

        models = (metadata_load(card) or {}).get("models") or []
        return models[0] if models else None
    return None


def serve(name: str) -> None:
    """Build the page for the model `name` and serve it (one request at a time reaches the model), until stopped."""
    build_demo(name).queue(default_concurrency_limit=1).launch()


if __name__ == "__main__":  # `python -m vanilla_transformer.demo`: the command lives in the command layer
    import runpy

    runpy.run_module("vanilla_transformer.commands.demo", run_name="__main__")
