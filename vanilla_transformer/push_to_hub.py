"""`python -m vanilla_transformer.push_to_hub`, the older name of `vanilla-transformer push`
(vanilla_transformer/commands/push_to_hub.py); the upload itself is vanilla_transformer/hub.py's."""

if __name__ == "__main__":  # `python -m vanilla_transformer.push_to_hub`: the command lives in the command layer
    import runpy

    runpy.run_module("vanilla_transformer.commands.push_to_hub", run_name="__main__")
