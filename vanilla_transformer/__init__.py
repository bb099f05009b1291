"""Training library for vanilla-transformer (never copied to the Hub).

Importing it imports neither torch nor transformers: a command's `--help` answers at once, and each module imports
what it needs. `register()` makes transformers know the model type `vanilla_transformer` in this process: the Auto
classes, so that a model folder loads with the installed code (`AutoModelForSeq2SeqLM.from_pretrained(folder)`, no
`trust_remote_code`), and the "translation" pipeline, which transformers 5 no longer has and whose registration makes
a saved folder's config.json name it under `custom_pipelines`. The library calls it where it loads or saves a model;
a script that loads a folder through the Auto classes itself calls it once. The Hub-facing files register nothing: a
Hub user's folder names its classes in `auto_map` and `custom_pipelines`.
"""


def register() -> None:
    """Register the model with transformers' Auto classes and the "translation" pipeline (idempotent)."""
    from vanilla_transformer.model.registration import register_model

    register_model()
