"""A web page that translates with a saved model and shows its attention: the demo, and a Hugging Face Space's app.

    pip install "vanilla-transformer[demo]"
    vanilla-transformer demo outputs/vanilla-transformer       # a model folder
    vanilla-transformer demo your-name/vanilla-en-de           # or a model on the Hub
    GRADIO_SERVER_PORT=8080 GRADIO_SERVER_NAME=0.0.0.0 vanilla-transformer demo MODEL   # Gradio's own settings apply

In a Space (`vanilla-transformer space` writes one), the model comes from the MODEL_ID variable of the Space's
settings, else from the `models:` list of the Space's card (`space_model`).

The page translates one sentence per line (lines split at "\n" only, as the translator reads a file), all lines as
one batch, with the beam size and length penalty of the model's generation_config.json as defaults (clamped to the
limits, and the page says so), and draws the attention weights of one layer and head as the attention-map command
does. The page shows the model's name (its card's, a Hub id or the folder's name), never a path of the server. The
same translation is an API endpoint, whose arguments are checked as the page's are (a gr.Error names a bad one):

    from gradio_client import Client
    Client("http://127.0.0.1:7860/").predict("The house is small.", api_name="/translate")   # num_beams=, length_penalty=

A public page must answer everyone: every request is bounded by `DemoLimits` (beams, lines, tokens per line and per
request, output tokens, seconds, the attention picture's tokens, requests at once, requests waiting), whose defaults
keep a request within seconds on a 2-core CPU and which a Space's owner changes with environment variables:

    VANILLA_DEMO_MAX_BEAMS=4 VANILLA_DEMO_TIME_BUDGET=20 vanilla-transformer demo MODEL
"""

import io
import os
import sys
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import MaxTimeCriteria, StoppingCriteriaList

from pipeline_vanilla_transformer import EXTRA_OUTPUT_TOKENS, PAPER_DECODING, configured_new_tokens
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.model.loading import finite_number, whole_number
from vanilla_transformer.serving.attention_maps import ATTENTION_KINDS, compute_attentions, plot_attention_grid
from vanilla_transformer.serving.translate import (
    ModelLoadError,
    load_model_and_tokenizer,
    split_lines,
    translate_sentences,
)

# "Encoder self-attention" -> output name
KIND_BY_TITLE = {title: kind for kind, (_, title, _, _) in ATTENTION_KINDS.items()}
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "cs": "Czech", "ro": "Romanian"}
MAX_LENGTH_PENALTY = 2.0  # the page's slider: 0 to 2
MAX_CARD_BYTES = 2**20  # a model card larger than this is not read (a card is a few KB)
MAX_NAME_CHARACTERS = 100


def env(name: str) -> dict:
    return {"env": name}


@dataclass(frozen=True)
class DemoLimits:
    """What one request may make the demo spend, so that a public page answers everyone within seconds on a 2-core
    CPU: a Space's free hardware. Each can be changed by the environment variable named in its field (a Space's
    settings): `VANILLA_DEMO_MAX_BEAMS=4 vanilla-transformer demo MODEL`.

    A request is at most `lines` lines of at most `line_tokens` source tokens each (and the model's positions),
    `request_tokens` in all; each line's translation gets the length the model's generation_config.json gives, else the paper's input + 50
    tokens, at most `new_tokens` (the
    defaults never cut a line the demo accepts: 200 + 50 < 256); beam search uses at most `beams`; generation stops
    when the request has run `seconds` (transformers' MaxTimeCriteria), and the page says so. The attention picture
    is drawn for lines of at most `attention_tokens` tokens a side. `concurrency` requests run at once, so a long one
    never holds the model from a short one; `queue_size` more wait, and the next is refused until one is served."""

    beams: int = field(default=8, metadata=env("VANILLA_DEMO_MAX_BEAMS"))
    lines: int = field(default=32, metadata=env("VANILLA_DEMO_MAX_LINES"))
    line_tokens: int = field(default=200, metadata=env("VANILLA_DEMO_MAX_LINE_TOKENS"))
    request_tokens: int = field(default=1000, metadata=env("VANILLA_DEMO_MAX_REQUEST_TOKENS"))
    new_tokens: int = field(default=256, metadata=env("VANILLA_DEMO_MAX_NEW_TOKENS"))
    seconds: float = field(default=10.0, metadata=env("VANILLA_DEMO_TIME_BUDGET"))
    attention_tokens: int = field(default=100, metadata=env("VANILLA_DEMO_MAX_ATTENTION_TOKENS"))
    concurrency: int = field(default=4, metadata=env("VANILLA_DEMO_CONCURRENCY"))
    queue_size: int = field(default=64, metadata=env("VANILLA_DEMO_QUEUE_SIZE"))

    def __post_init__(self):
        for spec in fields(self):
            value = getattr(self, spec.name)
            if not finite_number(value) or value <= 0 or (spec.type is int and value != int(value)):
                raise ValueError(f"DemoLimits.{spec.name} must be a positive {spec.type.__name__}, got {value!r}.")

    @property
    def characters(self) -> int:
        """The longest text read at all (tokenizing is cheap, but not free): 50 characters per token allowed."""
        return self.lines * self.line_tokens * 50

    @classmethod
    def from_environment(cls, environ=None) -> "DemoLimits":
        """The defaults, with those given by environment variables; DemoInputError names a bad one."""
        environ = os.environ if environ is None else environ
        values = {}
        for spec in fields(cls):
            name = spec.metadata["env"]
            text = environ.get(name, "").strip()
            if not text:
                continue
            try:
                values[spec.name] = spec.type(text)
                cls(**{spec.name: values[spec.name]})
            except ValueError:
                kind = "a whole number >= 1" if spec.type is int else "a number of seconds > 0"
                raise DemoInputError(f"{name}={text!r}: the demo's limit must be {kind}.") from None
        return cls(**values)


class DemoInputError(VanillaTransformerError, ValueError):
    """Input the demo refuses (too long, too many lines, a setting out of range), with a message for the page."""


class LoadError(ModelLoadError):
    """A model the demo cannot serve: the message names the model as the page does (no path of this machine);
    `detail`, for the server's log, may name the path."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail


@dataclass
class Translator:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # what the page shows: the card's model name, a Hub id or the folder's name; never a local path
    source_lang: str
    target_lang: str
    limits: DemoLimits = field(default_factory=DemoLimits)
    num_beams: int = PAPER_DECODING["num_beams"]  # the page's and the API's defaults: the model's
    length_penalty: float = PAPER_DECODING["length_penalty"]  # generation_config.json, within the limits
    notes: list[str] = field(default_factory=list)  # what the page says about its defaults (clamped ones)

    @property
    def max_source_tokens(self) -> int:
        return min(self.model.config.max_position_embeddings, self.limits.line_tokens)


def model_folder(name: str) -> Path:
    """`name` as a local model folder, or the Hub model of that id downloaded (cached) into one."""
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name))
    except Exception as error:  # noqa: BLE001 - an invalid id, offline, unreachable, unknown: the page says which
        raise ModelLoadError(
            f"{name} is neither a folder here nor a model the Hub gave ({type(error).__name__}: {error})"
        ) from error


def read_card(folder: Path) -> tuple[dict, str]:
    """The YAML header and the text of the folder's model card (README.md); ({}, "") if it has none, or one too
    large or unreadable."""
    card = folder / "README.md"
    try:
        if not card.is_file() or card.stat().st_size > MAX_CARD_BYTES:
            return {}, ""
        from huggingface_hub import metadata_load

        return metadata_load(card) or {}, card.read_text(encoding="utf-8")
    except Exception:  # noqa: BLE001 - a broken card (bad YAML, bad UTF-8) is a card without these facts
        return {}, ""


def card_languages(folder: Path) -> tuple[str, str]:
    """The source and target language of the model card's `language:` list; "source"/"target" if it has none."""
    languages = read_card(folder)[0].get("language")
    languages = languages if isinstance(languages, list) and len(languages) == 2 else ["source", "target"]
    return str(languages[0]), str(languages[1])


def model_name(name: str, folder: Path) -> str:
    """The model's name for the page: its card's model name (the model-index name, else the card's first `# `
    heading, as `save_model_folder` writes them), else the Hub id it was asked by, else the folder's name. Never a
    path of this machine."""
    metadata, text = read_card(folder)
    index = metadata.get("model-index")
    candidates = [index[0].get("name") if isinstance(index, list) and index and isinstance(index[0], dict) else None]
    candidates.append(next((line[2:] for line in text.splitlines() if line.startswith("# ")), None))
    candidates.append(None if Path(name).is_dir() else name)
    shown = next((str(c).strip() for c in candidates if c is not None and str(c).strip()), folder.resolve().name)
    return " ".join(shown.split())[:MAX_NAME_CHARACTERS]


def decoding_defaults(model: PreTrainedModel, limits: DemoLimits) -> tuple[int, float, list[str]]:
    """The beam size and length penalty of the model's generation_config.json, clamped to the limits and the page's
    range, and a note for each that was clamped."""
    config, notes = model.generation_config, []
    beams, penalty = config.num_beams or PAPER_DECODING["num_beams"], config.length_penalty
    if beams > limits.beams:
        notes.append(
            f"The model's generation_config.json asks for {beams} beams; this demo allows at most {limits.beams}, "
            "its default here."
        )
        beams = limits.beams
    if not finite_number(penalty):
        default = PAPER_DECODING["length_penalty"]
        notes.append(f"The model's length penalty {penalty!r} is not a number: the default here is {default}.")
        penalty = default
    elif not 0 <= penalty <= MAX_LENGTH_PENALTY:
        clamped = min(max(float(penalty), 0.0), MAX_LENGTH_PENALTY)
        notes.append(
            f"The model's length penalty {penalty:g} is outside the page's 0-2; the default here: {clamped:g}."
        )
        penalty = clamped
    return int(beams), float(penalty), notes


def load_translator(name: str, limits: DemoLimits | None = None) -> Translator:
    """The model and tokenizer of a folder or Hub id, with eager attention (it returns the weights to draw), and the
    decoding defaults within `limits` (the environment's, if not given); LoadError says why they cannot be loaded."""
    limits = limits or DemoLimits.from_environment()
    folder = model_folder(name)
    shown = model_name(name, folder)
    try:
        model, tokenizer = load_model_and_tokenizer(folder, attn_implementation="eager")
    except ModelLoadError as error:
        message = str(error)
        for path in sorted({str(folder.resolve()), str(folder)}, key=len, reverse=True):
            message = message.replace(path, shown)
        raise LoadError(message, detail=str(error)) from error
    beams, penalty, notes = decoding_defaults(model, limits)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return Translator(model, tokenizer, shown, *card_languages(folder), limits, beams, penalty, notes)


# --- one request, checked where it enters -------------------------------------------------------------------------


def whole_input(value, what: str, high: int) -> int:
    """`value` (from the page or an API call) as a whole number from 1 to `high`; DemoInputError names it otherwise."""
    if not whole_number(value, high):
        raise DemoInputError(f"{what} must be a whole number from 1 to {high}, got {value!r}.")
    return int(value)


def real_input(value, what: str, high: float) -> float:
    """`value` as a number from 0 to `high`; DemoInputError names it otherwise."""
    if not finite_number(value) or not 0 <= value <= high:
        raise DemoInputError(f"{what} must be a number from 0 to {high:g}, got {value!r}.")
    return float(value)


def check_text(text, limits: DemoLimits) -> list[str]:
    """The lines of `text` (`split_lines`, as the translator reads a file), if it is text the demo takes."""
    if not isinstance(text, str):
        raise DemoInputError(f"The text must be a string, got {type(text).__name__}: {text!r:.40}.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DemoInputError(
            f"The text is not valid Unicode: character {error.start + 1} is a lone surrogate "
            f"(U+{ord(text[error.start]):04X})."
        ) from None
    if len(text) > limits.characters:
        raise DemoInputError(f"The text has {len(text):,} characters; the demo reads at most {limits.characters:,}.")
    lines = split_lines(text)
    if len(lines) > limits.lines:
        raise DemoInputError(
            f"The input has {len(lines)} lines; the demo translates at most {limits.lines} at a time."
        )
    return lines


def check_lengths(translator: Translator, lines: list[str]) -> list[int]:
    """The lines' lengths in tokens, if none is too long for the model or the demo and all fit the request's total."""
    limits = translator.limits
    lengths = [len(ids) for ids in translator.tokenizer(lines)["input_ids"]] if lines else []
    too_long = [number for number, length in enumerate(lengths, start=1) if length > translator.max_source_tokens]
    if too_long:
        reader = "the model reads" if translator.max_source_tokens < limits.line_tokens else "the demo translates"
        raise DemoInputError(
            f"Line {too_long[0]} is too long: {lengths[too_long[0] - 1]} tokens, and {reader} at most "
            f"{translator.max_source_tokens}. Split it into shorter sentences, one per line."
        )
    if sum(lengths) > limits.request_tokens:
        raise DemoInputError(
            f"The input has {sum(lengths)} tokens; the demo translates at most {limits.request_tokens} per request: "
            "send fewer lines at a time."
        )
    return lengths


class TimeBudget(MaxTimeCriteria):
    """transformers' MaxTimeCriteria, started when the request arrives, that remembers whether it stopped generation."""

    ran_out = False

    def __call__(self, input_ids, scores, **kwargs):
        done = super().__call__(input_ids, scores, **kwargs)
        self.ran_out = self.ran_out or bool(done.any())
        return done


def wanted_new_tokens(model, lengths: list[int]) -> int:
    """The length the model's generation config gives, else section 6.1's: the longest line (in tokens) + 50."""
    configured = configured_new_tokens(model.generation_config)
    return max(lengths, default=0) + EXTRA_OUTPUT_TOKENS if configured is None else configured


def translate_text(translator: Translator, text, num_beams, length_penalty) -> tuple[str, str]:
    """Each line of `text` translated, all lines as one batch; line i of the result translates line i. Returns the
    translation and a note ("" if none): the time budget ran out and lines may be cut. DemoInputError refuses text and
    settings the page would not send or the limits do not allow, before anything is translated."""
    limits = translator.limits
    budget = TimeBudget(limits.seconds)
    num_beams = whole_input(num_beams, "The beam size", limits.beams)
    length_penalty = real_input(length_penalty, "The length penalty", MAX_LENGTH_PENALTY)
    lines = check_text(text, limits)
    lengths = check_lengths(translator, lines)
    settings = {"length_penalty": length_penalty} if num_beams > 1 else {}
    translations = translate_sentences(
        translator.model,
        translator.tokenizer,
        lines,
        batch_size=max(len(lines), 1),
        num_beams=num_beams,
        max_new_tokens=min(wanted_new_tokens(translator.model, lengths), limits.new_tokens),
        max_time=limits.seconds,  # also overrides a max_time of the model's own generation_config.json
        stopping_criteria=StoppingCriteriaList([budget]),
        **settings,
    )
    note = ""
    if budget.ran_out:
        note = (
            f"The translation ran out of the demo's time budget ({limits.seconds:g} s per request) and was stopped "
            "there: some lines may be cut short. Send fewer or shorter lines, or use a smaller beam."
        )
    return "\n".join(" ".join(translation.splitlines()) for translation in translations), note


def attention_image(translator: Translator, source: str, translation: str, kind_title, layer, head):
    """A PIL image of one layer's and head's attention weights of `kind_title` (a title in ATTENTION_KINDS) over the
    tokens of `source` and its `translation`, drawn by the attention-map command's plot_attention_grid. DemoInputError
    refuses an unknown kind, layer or head, and a picture over the limits' `attention_tokens` a side, before any
    weight is computed."""
    from PIL import Image

    if not isinstance(kind_title, str) or kind_title not in KIND_BY_TITLE:
        raise DemoInputError(f"The attention must be one of {', '.join(KIND_BY_TITLE)}; got {kind_title!r}.")
    kind = KIND_BY_TITLE[kind_title]
    config, encoder = translator.model.config, kind == "encoder_attentions"
    layers = config.encoder_layers if encoder else config.decoder_layers
    heads = config.encoder_attention_heads if encoder else config.decoder_attention_heads
    try:
        layer, head = whole_input(layer, "The layer", layers), whole_input(head, "The head", heads)
    except DemoInputError:
        raise DemoInputError(
            f"{kind_title} has {layers} layers of {heads} heads: pick a layer and head within them."
        ) from None
    source_tokens = len(translator.tokenizer(source)["input_ids"])
    target_tokens = len(translator.tokenizer(translation)["input_ids"]) + 1  # the decoder reads <s> first
    limit = translator.limits.attention_tokens
    if max(source_tokens, target_tokens) > limit:
        raise DemoInputError(
            f"The attention picture would be {target_tokens} x {source_tokens} tokens; the demo draws at most {limit} "
            "tokens a side. Put a shorter line first to see its attention."
        )
    attentions = compute_attentions(translator.model, translator.tokenizer, source, target=translation)
    _, title, query_side, key_side = ATTENTION_KINDS[kind]
    weights = attentions[kind]
    figure = plot_attention_grid(
        weights[layer - 1 : layer, head - 1 : head], attentions[query_side], attentions[key_side], title
    )
    figure.axes[0].set_title(f"layer {layer}, head {head}", fontsize=8)  # the grid numbers its one map 1, 1
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=150)
    return Image.open(io.BytesIO(buffer.getvalue()))


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def respond(translator: Translator, text, num_beams, length_penalty, show, kind, layer, head):
    """The page's answer to a click: (translation, attention image or None, message); nothing for an empty box. A
    picture refused keeps the translation, with the reason."""
    import gradio as gr

    if isinstance(text, str) and not text.strip():
        return gr.skip(), gr.skip(), gr.skip()
    try:
        translated, note = translate_text(translator, text, num_beams, length_penalty)
    except DemoInputError as error:
        return "", None, f"**{error}**"
    notes, image = [note] if note else [], None
    if show is True:
        pairs = zip(split_lines(text), translated.split("\n"), strict=True)
        source, translation = next(pair for pair in pairs if pair[0].strip())
        try:
            image = attention_image(translator, source, translation, kind, layer, head)
        except DemoInputError as error:
            notes.append(str(error))
    return translated, image, "\n\n".join(f"**{note}**" for note in notes)


def failed_page(error: Exception, what: str = "The model could not be loaded."):
    import gradio as gr

    with gr.Blocks(title="vanilla-transformer demo") as demo:
        gr.Markdown(f"# vanilla-transformer\n\n**{what}** {error}", elem_id="message")
    return demo


def build_demo(name: str, limits: DemoLimits | None = None):
    """The Gradio page for the model `name`, queued with the limits' concurrency (the environment's limits if not
    given); if the model cannot be loaded or a limit is bad, a page that says why."""
    import gradio as gr

    try:
        limits = limits or DemoLimits.from_environment()
    except DemoInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return failed_page(error, "The demo's limits are not valid.")
    try:
        translator = load_translator(name, limits)
    except ModelLoadError as error:
        print(f"error: {getattr(error, 'detail', error)}", file=sys.stderr)
        return failed_page(error)
    config, limits = translator.model.config, translator.limits
    source, target = language_name(translator.source_lang), language_name(translator.target_lang)
    with gr.Blocks(title=f"vanilla-transformer: {translator.name}") as demo:
        gr.Markdown(
            f"# vanilla-transformer: {translator.name}\n\nThe Transformer of *Attention Is All You Need* (2017), "
            f"translating {source} to {target}. One sentence per line; all lines translate as one batch: at most "
            f"{limits.lines} lines of {translator.max_source_tokens} tokens, {limits.request_tokens} tokens in all, "
            f"{limits.seconds:g} s per request." + "".join(f"\n\n*{note}*" for note in translator.notes)
        )
        with gr.Row():
            with gr.Column():
                text = gr.Textbox(label=f"Source ({source})", lines=4, max_lines=limits.lines, elem_id="source")
                with gr.Row():
                    num_beams = gr.Slider(1, limits.beams, step=1, value=translator.num_beams, label="Beam size")
                    length_penalty = gr.Slider(
                        0, MAX_LENGTH_PENALTY, step=0.05, value=translator.length_penalty, label="Length penalty"
                    )
                button = gr.Button("Translate", variant="primary", elem_id="translate")
            with gr.Column():
                translation = gr.Textbox(
                    label=f"Translation ({target})", lines=4, interactive=False, elem_id="translation"
                )
                message = gr.Markdown(elem_id="message")
        with gr.Accordion("Attention maps", open=False):
            show = gr.Checkbox(label="Draw the attention of the first line", elem_id="show_attention")
            with gr.Row():
                kind = gr.Radio(
                    list(KIND_BY_TITLE), value=next(iter(KIND_BY_TITLE)), label="Attention", elem_id="kind"
                )
                layers = max(config.encoder_layers, config.decoder_layers)
                heads = max(config.encoder_attention_heads, config.decoder_attention_heads)
                layer = gr.Slider(1, layers, step=1, value=1, label="Layer", elem_id="layer")
                head = gr.Slider(1, heads, step=1, value=1, label="Head", elem_id="head")
            image = gr.Image(label="Attention weights", type="pil", format="png", elem_id="attention")
        inputs = [text, num_beams, length_penalty, show, kind, layer, head]
        outputs = [translation, image, message]
        # one concurrency group for both: `limits.concurrency` requests reach the model at once, each for at most
        # `limits.seconds`, so a short request waits behind a long one only when all of them are taken
        shared = {"concurrency_id": "model", "concurrency_limit": limits.concurrency}
        button.click(partial(respond, translator), inputs, outputs, api_visibility="private", **shared)
        gr.api(api_endpoint(translator), api_name="translate", **shared)
    return demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)


def api_endpoint(translator: Translator):
    """The /translate endpoint: text in (one sentence per line), translation out; the decoding settings optional,
    with the page's defaults. Every argument is checked as the page's are (gr.Error names a bad one), and a request
    that runs out of the time budget is an error rather than a silently cut translation."""
    import gradio as gr

    def translate(
        text: str, num_beams: int = translator.num_beams, length_penalty: float = translator.length_penalty
    ) -> str:
        """Translate `text`, one sentence per line, all lines as one batch."""
        if isinstance(text, str) and not text.strip():
            return ""
        try:
            translated, note = translate_text(translator, text, num_beams, length_penalty)
        except DemoInputError as error:
            raise gr.Error(str(error), print_exception=False) from None
        if note:
            raise gr.Error(note, print_exception=False)
        return translated

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
    """Build the page for the model `name` and serve it within the environment's `DemoLimits`, until stopped."""
    build_demo(name).launch()
