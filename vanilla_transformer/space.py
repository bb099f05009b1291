"""Write a Hugging Face Space (Gradio) that runs the demo (vanilla_transformer/demo.py) for a model on the Hub;
optionally upload it. The command is `vanilla-transformer space` (vanilla_transformer/commands/space.py).

The Space's folder holds app.py (`SPACE_APP`: it serves the demo), the code it runs (the model's files and the few
library modules the demo imports, copied from this installation: no training code), requirements.txt and a
README.md whose YAML header is the Space's configuration, naming the model under `models:`, where app.py reads it (a
MODEL_ID variable in the Space's settings overrides it). A subfolder of the model folder, such as MODEL_DIR/space,
stays local when the model is uploaded. The Space loads the model from the Hub when it starts: upload the model
first (`vanilla-transformer push`). Offline or unreachable, the upload fails with a message and the written files
stay.
"""

import shutil
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import HfApi

import modeling_vanilla_transformer
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.hub import hub_failure
from vanilla_transformer.names import CODE_FILES

# the library modules the demo imports, by their path in the Space (= their path in the installed package)
LIBRARY_CODE = ("__init__.py", "demo.py", "attention_maps.py", "translate.py")
SPACE_CODE = ("app.py", *CODE_FILES, *(f"vanilla_transformer/{name}" for name in LIBRARY_CODE))
SPACE_FILES = (*SPACE_CODE, "requirements.txt", "README.md")
SPACE_APP = '''"""The Space's page: vanilla-transformer's demo (vanilla_transformer/demo.py) for the model in README.md's `models:`
(or the MODEL_ID variable of the Space's settings). Written by `vanilla-transformer space`."""

from pathlib import Path

from vanilla_transformer.demo import serve, space_model

if __name__ == "__main__":  # a Space runs `python app.py`
    serve(space_model(Path(__file__).with_name("README.md")))
'''
REQUIREMENTS = ("torch", f"transformers{SUPPORTED_TRANSFORMERS}", "matplotlib>=3.8.4", "huggingface_hub")
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


class SpaceError(Exception):
    """A Space that could not be written or uploaded, with the reason in one message."""


def write_space(model_id: str, output_dir: str | Path, space_id: str | None = None) -> list[Path]:
    """Write the Space's files for the Hub model `model_id` into `output_dir`; return their paths. A model folder
    (config.json) or a README.md that is not a Space's card is refused: the Space's README.md would replace it."""
    output_dir = Path(output_dir)
    readme = output_dir / "README.md"
    if (output_dir / "config.json").is_file():
        raise SpaceError(f"{output_dir} is a model folder: its model card would be replaced; use {output_dir}/space")
    if readme.is_file() and "\nsdk: gradio\n" not in readme.read_text(encoding="utf-8"):
        raise SpaceError(f"{readme} exists and is not a Space's card: choose another --output_dir")
    (output_dir / "vanilla_transformer").mkdir(parents=True, exist_ok=True)
    (output_dir / "app.py").write_text(SPACE_APP, encoding="utf-8")
    written = [output_dir / "app.py"]
    model_code = Path(modeling_vanilla_transformer.__file__).parent  # the installed Hub-facing files
    for name in CODE_FILES:
        written.append(Path(shutil.copyfile(model_code / name, output_dir / name)))
    library = resources.files("vanilla_transformer")
    for name in LIBRARY_CODE:
        (output_dir / "vanilla_transformer" / name).write_bytes((library / name).read_bytes())
        written.append(output_dir / "vanilla_transformer" / name)
    (output_dir / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n", encoding="utf-8")
    title = f"{model_id.split('/')[-1]} demo"
    readme.write_text(
        README_TEMPLATE.format(
            title=title, gradio=gradio_version(), model_id=model_id, space_id=space_id or "SPACE_ID"
        ),
        encoding="utf-8",
    )
    return [*written, output_dir / "requirements.txt", readme]  # = SPACE_FILES


def gradio_version() -> str:
    try:
        return version("gradio")
    except PackageNotFoundError:
        return GRADIO_TESTED


def upload_space(folder: str | Path, space_id: str, token: str | None = None, private: bool = False) -> str:
    """Create the Gradio Space `space_id` if needed and upload `folder` to it; return its URL. Offline, unreachable
    or refused: SpaceError saying which; nothing local is changed."""
    try:
        api = HfApi(token=token)
        url = api.create_repo(space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True)
        api.upload_folder(
            repo_id=space_id,
            repo_type="space",
            folder_path=folder,
            allow_patterns=list(SPACE_FILES),  # never the folder's caches or anything else it holds
            commit_message="vanilla-transformer demo",
        )
    except Exception as error:  # noqa: BLE001 - each failure of the Hub calls becomes one message
        raise SpaceError(hub_failure(error, f"upload {folder} to the Space {space_id}")) from error
    return str(url)


if __name__ == "__main__":  # `python -m vanilla_transformer.space`: the command lives in the command layer
    import runpy

    runpy.run_module("vanilla_transformer.commands.space", run_name="__main__")
