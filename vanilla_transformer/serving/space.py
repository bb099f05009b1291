"""Write a Hugging Face Space (Gradio) that runs the demo (vanilla_transformer/serving/demo.py) for a model on the Hub;
optionally upload it. The command is `vanilla-transformer space` (vanilla_transformer/commands/space.py).

The Space's folder holds app.py (`SPACE_APP`: it serves the demo), the code it runs (the model's files and the few
library modules the demo imports, copied from this installation: no training code), requirements.txt and a
README.md whose YAML header is the Space's configuration, naming the model under `models:`, where app.py reads it (a
MODEL_ID variable in the Space's settings overrides it). A subfolder of the model folder, such as MODEL_DIR/space,
stays local when the model is uploaded. The Space loads the model from the Hub when it starts: upload the model
first (`vanilla-transformer push`). Offline or unreachable, the upload fails with a message and the written files
stay.

The folder is the user's until we write it: a folder that holds anything is refused, naming what it holds; with
`overwrite`, the files a previous export wrote (listed with their sha256 in `SPACE_RECORD`, each listed before it
is written) are replaced, and only while unchanged since; other files stay. Files are written by replacing them,
never through a symbolic link (a link where a Space file goes is refused). The upload sends `SPACE_FILES` only, as
regular files inside the folder (never a link's target), each checked first: Python that parses, UTF-8 text, the
card's `sdk: gradio` header. The same upload sends a static Space (`sdk: static`: the page `export-onnx --web`
writes, serving/web_page.py) given the names of its files, with no app.py.
"""

from collections.abc import Sequence
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from huggingface_hub import CommitOperationAdd, HfApi

import modeling_vanilla_transformer
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.hub.upload import hub_failure
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import (
    content_problem,
    describe_link,
    file_problem,
    link_on_the_way,
    replace_file,
)
from vanilla_transformer.mechanics.integrity import files_problem, sha256_of
from vanilla_transformer.mechanics.names import CODE_FILES
from vanilla_transformer.mechanics.outputs import NotRecorded, check_output_folder, recorded_files, write_record

# the library modules the demo imports, by their path in the Space (= their path in the installed package)
LIBRARY_CODE = (  # what the demo imports, as paths inside the package
    "__init__.py",
    "serving/__init__.py",
    "serving/demo.py",
    "serving/attention_maps.py",
    "serving/translate.py",
    "serving/sentences.py",
    "serving/batches.py",
    "serving/settings.py",
    "model/__init__.py",
    "model/loading.py",
    "model/upgrade.py",
    "model/onednn.py",
    "model/decoding.py",
    "model/beam_cache.py",
    "model/beam_search.py",
    "model/registration.py",
    "mechanics/__init__.py",
    "mechanics/names.py",
    "mechanics/errors.py",
)
SPACE_CODE = ("app.py", *CODE_FILES, *(f"vanilla_transformer/{name}" for name in LIBRARY_CODE))
SPACE_FILES = (*SPACE_CODE, "requirements.txt", "README.md")
WRITTEN_BY = "vanilla-transformer space"
SPACE_RECORD = ".vanilla_transformer_space.json"  # what the export wrote (mechanics/outputs.py); never uploaded
SPACE_APP = '''"""The Space's page: vanilla-transformer's demo (vanilla_transformer/serving/demo.py) for the model in README.md's `models:`
(or the MODEL_ID variable of the Space's settings). Written by `vanilla-transformer space`."""

from pathlib import Path

from vanilla_transformer.serving.demo import serve, space_model

if __name__ == "__main__":  # a Space runs `python app.py`
    serve(space_model(Path(__file__).with_name("README.md")))
'''
REQUIREMENTS = ("torch", f"transformers{SUPPORTED_TRANSFORMERS}", "matplotlib>=3.8.4", "huggingface_hub", "sentencex")
GRADIO_TESTED = "6.31.0"  # the Space's gradio when none is installed here: the release the demo was tested with
README_TEMPLATE = """---
title: {title}
emoji: 🔤
colorFrom: indigo
colorTo: green
sdk: gradio
sdk_version: {gradio}
app_file: app.py
models:
- {model_id}
license: apache-2.0
short_description: Translate with the 2017 Transformer and see its attention
---

# {title}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) from the model
[{model_id}](https://huggingface.co/{model_id}): type one sentence per line, pick the beam size and length penalty,
and look at the attention weights of any layer and head. The page is the demo of the vanilla-transformer project
(`vanilla-transformer demo {model_id}` runs it locally); `gradio_client.Client("{space_id}").predict(text,
api_name="/translate")` calls it from Python. Another model: set the variable MODEL_ID in the Space's settings.
"""


class SpaceError(VanillaTransformerError):
    """A Space that could not be written or uploaded, with the reason in one message."""


def write_space(
    model_id: str, output_dir: str | Path, space_id: str | None = None, overwrite: bool = False
) -> list[Path]:
    """Write the Space's files for the Hub model `model_id` into `output_dir`; return their paths. A folder that
    holds anything is refused (`check_space_folder`), a model folder or a README.md that is not a Space's card
    whatever `overwrite` says; with `overwrite`, a previous export's files are replaced (module docstring)."""
    output_dir = Path(output_dir)
    check_space_folder(output_dir, overwrite)
    model_code = Path(modeling_vanilla_transformer.__file__).parent  # the installed Hub-facing files
    library = resources.files("vanilla_transformer")
    title = f"{model_id.split('/')[-1]} demo"
    card = README_TEMPLATE.format(
        title=title, gradio=gradio_version(), model_id=model_id, space_id=space_id or "SPACE_ID"
    )
    contents = {
        "app.py": SPACE_APP.encode("utf-8"),
        **{name: (model_code / name).read_bytes() for name in CODE_FILES},
        **{f"vanilla_transformer/{name}": library.joinpath(*name.split("/")).read_bytes() for name in LIBRARY_CODE},
        "requirements.txt": ("\n".join(REQUIREMENTS) + "\n").encode("utf-8"),
        "README.md": card.encode("utf-8"),
    }
    files = {name: None for name in contents}  # listed before written: a crash leaves none of ours unlisted
    output_dir.mkdir(parents=True, exist_ok=True)
    write_record(output_dir, SPACE_RECORD, WRITTEN_BY, files)
    for name, data in contents.items():
        (output_dir / name).parent.mkdir(parents=True, exist_ok=True)
        replace_file(output_dir / name, data)
        files[name] = {"size": len(data), "sha256": sha256_of(output_dir / name)}
    write_record(output_dir, SPACE_RECORD, WRITTEN_BY, files)
    return [output_dir / name for name in contents]  # = SPACE_FILES


def read_space_record(folder: Path) -> dict:
    """{name: {"size", "sha256"}, or None (listed, being written)} of the files a previous export wrote into `folder`
    (mechanics/outputs.py's record); {} without a record. SpaceError when the record is a link or damaged."""
    if not (folder / SPACE_RECORD).exists() and not (folder / SPACE_RECORD).is_symlink():
        return {}
    try:
        files = recorded_files(folder, SPACE_RECORD, WRITTEN_BY)
        if not isinstance(files, dict) or not all(name in SPACE_FILES for name in files):
            raise NotRecorded("it lists files a Space export does not write")
        if damaged := files_problem(folder, {name: entry for name, entry in files.items() if entry}, only=()):
            raise NotRecorded(damaged)
    except NotRecorded as why:
        raise SpaceError(
            f"{folder / SPACE_RECORD} is damaged ({why}): move the Space's files away yourself or choose another "
            "--output_dir"
        ) from None
    return files


def check_space_folder(output_dir: Path, overwrite: bool) -> None:
    """The one output-folder rule (mechanics/outputs.py) for a Space: SpaceError, before anything is written, for a
    file or link there, or a folder holding anything, unless `overwrite` and every Space file there is one a previous
    export wrote and nobody changed since (a record alone counts as nothing)."""
    check_output_folder(
        output_dir,
        overwrite=overwrite,
        why_not_previous=why_not_a_space,
        previous="a Space that `vanilla-transformer space` wrote",
        error=SpaceError,
        ignore=(SPACE_RECORD,),
    )


def why_not_a_space(folder: Path) -> str | None:
    """None if every Space file in `folder` is one a previous export wrote, unchanged since; else why not (a link where
    a Space file goes, a model folder, another card, a file no export wrote or one changed since)."""
    if links := sorted({str(link) for name in SPACE_FILES if (link := link_on_the_way(folder, name))}):
        return f"{'; '.join(describe_link(Path(link)) for link in links)}, and the Space writer never writes through a link"
    if (folder / "config.json").is_file():
        return f"it is a model folder, whose model card would be replaced: use {folder}/space"
    readme = folder / "README.md"
    if readme.is_file() and "\nsdk: gradio\n" not in readme.read_text(encoding="utf-8", errors="replace"):
        return "its README.md is not a Space's card"
    recorded = read_space_record(folder)
    foreign = []
    if (folder / "vanilla_transformer").exists() and not (folder / "vanilla_transformer").is_dir():
        foreign.append("vanilla_transformer (a file where the Space's code folder goes)")
    for name in SPACE_FILES:
        path = folder / name
        if not path.exists():
            continue
        if name not in recorded:
            foreign.append(f"{name} (not written by vanilla-transformer space)")
        elif recorded[name] is None:  # listed before an export was stopped: nothing proves who wrote it
            foreign.append(f"{name} (listed by an export that did not finish, so maybe not ours: remove it yourself)")
        elif files_problem(folder, {name: recorded[name]}):
            foreign.append(f"{name} (changed since vanilla-transformer space wrote it)")
    if foreign:
        return f"it holds {', '.join(foreign)}"
    return None if recorded else "it holds no record of a Space export"


def gradio_version() -> str:
    try:
        return version("gradio")
    except PackageNotFoundError:
        return GRADIO_TESTED


def space_upload_problems(folder: str | Path, names: Sequence[str] = SPACE_FILES) -> list[str]:
    """Why `folder`'s files `names` (default: the Gradio Space's SPACE_FILES) cannot go up as a Space: each must be a
    regular file inside the folder (a symbolic link is never followed) and what its name says (Python that parses,
    UTF-8 text), and README.md among them a Space's card: `sdk: gradio`, or `sdk: static` with its `app_file` sent."""
    folder = Path(folder)
    problems = [problem for name in names if (problem := file_problem(folder, name))]
    present = [name for name in names if not file_problem(folder, name)]
    problems += [problem for name in present if (problem := content_problem(folder / name))]
    if "README.md" not in names:
        problems.append("no README.md, the Space's card, among the files")
    elif "README.md" in present and not content_problem(folder / "README.md"):
        problems += card_problems(card_header(folder / "README.md"), names)
    return problems


def check_space_upload(folder: Path, names: Sequence[str]) -> None:
    """SpaceError naming every problem `space_upload_problems` finds."""
    if problems := space_upload_problems(folder, names):
        raise SpaceError(f"{folder} is not ready to upload as a Space: {'; '.join(problems)}")


def card_header(readme: Path) -> dict:
    """The YAML header of a card (between its first two `---` lines); {} without one, or one that is not a mapping."""
    lines = readme.read_text(encoding="utf-8").split("\n")
    if lines[0] != "---" or "---" not in lines[1:]:
        return {}
    try:
        header = yaml.safe_load("\n".join(lines[1 : lines.index("---", 1)]))
    except yaml.YAMLError:
        return {}
    return header if isinstance(header, dict) else {}


def card_problems(header: dict, names: Sequence[str]) -> list[str]:
    """Why a card's header is not that of a Space whose files are `names`: `sdk: gradio`, or `sdk: static` whose page
    (`app_file`, index.html by default) is among them."""
    if header.get("sdk") == "gradio":
        return []
    if header.get("sdk") == "static":
        page = header.get("app_file", "index.html")
        return [] if page in names else [f"README.md's app_file {page} is not among the files sent"]
    return ["README.md is not a Space's card (no `sdk: gradio` or `sdk: static` in its header)"]


def upload_space(
    folder: str | Path,
    space_id: str,
    token: str | None = None,
    private: bool = False,
    names: Sequence[str] = SPACE_FILES,
) -> str:
    """Create the Space `space_id` if needed (with the SDK its card names) and upload `folder`'s files `names` to it
    (default: the Gradio Space's SPACE_FILES; never the folder's caches or anything else it holds); return its URL.
    Files that cannot go up (`space_upload_problems`): SpaceError naming them, before any Hub call. Offline,
    unreachable or refused: SpaceError saying which; nothing local is changed."""
    folder = Path(folder)
    check_space_upload(folder, names)
    sdk = card_header(folder / "README.md")["sdk"]
    operations = [CommitOperationAdd(name, folder / name) for name in names]
    message = "vanilla-transformer demo" if sdk == "gradio" else "vanilla-transformer page"
    try:
        api = HfApi(token=token)
        url = api.create_repo(space_id, repo_type="space", space_sdk=sdk, private=private, exist_ok=True)
        api.create_commit(repo_id=space_id, repo_type="space", operations=operations, commit_message=message)
    except Exception as error:  # noqa: BLE001 - each failure of the Hub calls becomes one message
        raise SpaceError(hub_failure(error, f"upload {folder} to the Space {space_id}")) from error
    return str(url)
