"""Reading a fairseq checkpoint without running any of its code.

It loads with torch.load(weights_only=True), only `argparse.Namespace` and omegaconf's containers allowed besides
tensors and containers: a checkpoint needing any other class is refused with its name, before any of it is loaded.
fairseq 0.10 and later keep their settings as `cfg`, an omegaconf DictConfig in some versions: its pickle is read
without omegaconf (which is not needed here, and whose classes are never imported) by stand-ins registered under
omegaconf's names (OMEGACONF_STANDINS), which keep only the state pickled for them and become plain dicts and lists.
"""

import argparse
import pickle
import re
import zipfile
from pathlib import Path

import torch

from vanilla_transformer.converters.core import ConversionError
from vanilla_transformer.converters.untrusted import MAX_CHECKPOINT_BYTES

ALLOWED_CLASSES = (argparse.Namespace,)  # what a fairseq checkpoint may hold besides tensors and containers


class OmegaConfState:
    """What a pickled omegaconf container or node holds, kept as data: its `_content` (a container's: a dict or a list
    of nodes, or None) or `_val` (a node's value). Metadata, parents and flags are dropped."""

    def __setstate__(self, state) -> None:
        state = state if isinstance(state, dict) else {}
        self.value = state.get("_content", state.get("_val"))


class OmegaConfReference:
    """A type an omegaconf pickle names in its metadata (typing.Any, dict, ...): a name, never the type itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args):  # defaultdict(dict) in a container's metadata: its resolver cache, dropped
        return {}


OMEGACONF_CLASSES = (
    "omegaconf.dictconfig.DictConfig",
    "omegaconf.listconfig.ListConfig",
    "omegaconf.base.Metadata",
    "omegaconf.base.ContainerMetadata",
    "omegaconf.nodes.AnyNode",
    "omegaconf.nodes.StringNode",
    "omegaconf.nodes.IntegerNode",
    "omegaconf.nodes.FloatNode",
    "omegaconf.nodes.BooleanNode",
    "omegaconf.nodes.BytesNode",
    "omegaconf.nodes.PathNode",
    "omegaconf.nodes.InterpolationResultNode",
)
# the types their metadata names (ref_type, object_type, key_type, element_type) and its resolver cache
OMEGACONF_REFERENCES = (
    "typing.Any",
    "builtins.dict",
    "builtins.list",
    "builtins.str",
    "builtins.int",
    "builtins.float",
    "builtins.bool",
    "builtins.bytes",
    "builtins.object",
    "collections.defaultdict",
)
OMEGACONF_STANDINS = [
    *((type(name.rpartition(".")[2], (OmegaConfState,), {}), name) for name in OMEGACONF_CLASSES),
    *((OmegaConfReference(name), name) for name in OMEGACONF_REFERENCES),
]
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


# fairseq's settings (args or cfg.model): field -> (the value it must have, what another value means); absent is fine
def load_fairseq_checkpoint(path: Path) -> dict:
    """torch.load(weights_only=True) with only ALLOWED_CLASSES allowed: never unpickles anything else. A checkpoint
    that needs another class is refused naming it (all of them, for the zip format), before any of it is loaded."""
    if (size := path.stat().st_size) > MAX_CHECKPOINT_BYTES:
        raise ConversionError(f"{path} is {size:,} bytes, over the {MAX_CHECKPOINT_BYTES:,} a checkpoint may have")
    allowed = {f"{kind.__module__}.{kind.__qualname__}" for kind in ALLOWED_CLASSES} | {
        name for _, name in OMEGACONF_STANDINS
    }
    is_zip = zipfile.is_zipfile(path)
    with open(path, "rb") as file:
        start = file.read(2)
    if not is_zip and not start.startswith(b"\x80"):  # torch.save writes a zip archive, or (legacy) a pickle
        what = "is empty" if not start else "is neither a zip archive nor a pickle"
        raise ConversionError(f"{path} is not a torch checkpoint: it {what}")
    if is_zip:
        try:
            needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as error:  # noqa: BLE001 - a damaged file: said in one line
            raise ConversionError(f"{path} is not a readable torch checkpoint: {error}") from None
        if unlisted := sorted(set(needed) - allowed):
            raise unpickling_refusal(path, unlisted)
    try:
        with torch.serialization.safe_globals([*ALLOWED_CLASSES, *OMEGACONF_STANDINS]):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as error:
        if needed := re.findall(r"GLOBAL (\S+)", str(error))[:1]:
            raise unpickling_refusal(path, needed) from None
        raise ConversionError(f"{path} is not a readable torch checkpoint: its pickle is damaged") from None
    except (RuntimeError, EOFError, ValueError, KeyError, IndexError, UnicodeDecodeError) as error:
        raise ConversionError(f"{path} is not a readable torch checkpoint ({type(error).__name__}: {error})") from None
    except TypeError as error:  # a stand-in called or built as omegaconf's pickles never do
        raise ConversionError(f"{path} is not a fairseq checkpoint omegaconf wrote: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConversionError(f"{path} is not a fairseq checkpoint: it has no `model` state dict")
    if "cfg" in state:
        state["cfg"] = resolved(plain(state["cfg"]))
    return state


def plain(value, seen: frozenset = frozenset()):
    """An unpickled omegaconf container (its stand-ins) as plain dicts and lists; other values as they are."""
    if id(value) in seen:
        raise ConversionError("the checkpoint's cfg contains itself")
    inner = seen | {id(value)}
    if isinstance(value, OmegaConfState):
        return plain(value.value, inner)
    if isinstance(value, OmegaConfReference):
        return value.name
    if isinstance(value, dict):
        return {key: plain(item, inner) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item, inner) for item in value)
    if isinstance(value, argparse.Namespace):
        return argparse.Namespace(**plain(vars(value), inner))
    return value


def resolved(cfg, root=None, depth: int = 0):
    """`cfg` with each value that is an absolute omegaconf interpolation ("${task.max_source_positions}") replaced by
    the value it names (omegaconf keeps them unresolved); others left as they are."""
    root = cfg if root is None else root
    if isinstance(cfg, dict):
        return {key: resolved(item, root, depth) for key, item in cfg.items()}
    if isinstance(cfg, list):
        return [resolved(item, root, depth) for item in cfg]
    if isinstance(cfg, str) and (match := INTERPOLATION.fullmatch(cfg)) and depth < 10:
        target = root
        for part in match[1].split("."):
            target = vars(target) if isinstance(target, argparse.Namespace) else target
            if not isinstance(target, dict) or part not in target:
                return cfg
            target = target[part]
        return resolved(target, root, depth + 1)
    return cfg


def unpickling_refusal(path: Path, names: list[str]) -> ConversionError:
    return ConversionError(
        f"{path} needs {', '.join(names)} to be unpickled, which this converter does not allow (unpickling a class "
        f"runs its code; only {', '.join(kind.__name__ for kind in ALLOWED_CLASSES)} and omegaconf's containers "
        "are allowed besides tensors and containers)."
    )
