"""The one root of every refusal the project makes: bad input, a folder it may not write, a model it cannot load.

A refusal's message names what was refused (the flag, the file and line, the field) and what to do. The commands catch
`VanillaTransformerError` in one place (`commands.runner.run`), print `error: MESSAGE` and exit 1; a library caller
catches it, or one of its subclasses, the same way. A subclass may also derive from the built-in exception it has
always been (`ValueError`, `RuntimeError`), so that callers who caught that keep working.
"""


class VanillaTransformerError(Exception):
    """A refusal, with a message a user can act on."""
