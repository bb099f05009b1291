"""Upload a model folder to the Hub: exactly its model repository's files, once the folder's checks find nothing
wrong.

The files are `model_folder.files_to_upload`, an allow-list of regular files inside the folder, never a symbolic
link; the checks are `model_folder.hub_folder_problems`. Every failed Hub call is explained in one paragraph
(`hub_failure`)."""

from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi

from vanilla_transformer.hub.model_card import MODEL_ID_PLACEHOLDER
from vanilla_transformer.hub.model_folder import files_to_upload, hub_folder_problems
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import replace_file
from vanilla_transformer.mechanics.names import COMMIT_MESSAGE


class HubUploadError(VanillaTransformerError, RuntimeError):
    """An upload that did not happen (offline, unreachable, refused); nothing local was changed."""


class FolderNotReadyError(HubUploadError, ValueError):
    """A folder refused before any upload (`hub_folder_problems`'s problems); nothing was uploaded or changed."""


def push_folder_to_hub(
    folder: str | Path,
    repo_id: str,
    token: str | None = None,
    private: bool = False,
    commit_message: str = COMMIT_MESSAGE,
) -> str:
    """Upload the model repository's files of `folder` (`files_to_upload`) to the Hub model repo `repo_id` (created
    if needed) in one commit; return its URL. The folder is checked first; the card is uploaded with the model id
    placeholder in its code replaced by `repo_id`, and the local card gets the same text only once the upload
    succeeded (by replacing the file: never written through a link). A folder with problems: FolderNotReadyError
    naming them, before any Hub call. Offline, unreachable or refused: a HubUploadError that says so, with nothing
    changed locally."""
    folder = Path(folder)
    problems = hub_folder_problems(folder)
    if problems:
        raise FolderNotReadyError(f"{folder} is not ready for the Hub:\n- " + "\n- ".join(problems))
    names = files_to_upload(folder)
    print(f"[hub] uploading to {repo_id}: {', '.join(names)}")
    readme = (folder / "README.md").read_text(encoding="utf-8").replace(MODEL_ID_PLACEHOLDER, repo_id)
    operations = [
        CommitOperationAdd(name, readme.encode("utf-8") if name == "README.md" else folder / name) for name in names
    ]
    try:
        api = HfApi(token=token)
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.create_commit(repo_id, operations, commit_message=commit_message)
    except Exception as error:  # noqa: BLE001 - every failure of the Hub calls gets the same clear message
        raise HubUploadError(hub_failure(error, f"upload {folder} to {repo_id}")) from error
    replace_file(folder / "README.md", readme)
    return str(repo_url)


def hub_failure(error: Exception, action: str) -> str:
    """A one-paragraph explanation of a failed Hub call (offline mode, no connection, refused), for the user."""
    kinds = {cls.__name__ for cls in type(error).__mro__}
    if "OfflineModeIsEnabled" in kinds:
        reason = "offline mode is on (HF_HUB_OFFLINE is set); unset it to reach the Hub"
    elif kinds & {"ConnectionError", "TransportError", "NetworkError", "TimeoutException"}:  # requests, httpx
        reason = f"the Hub cannot be reached ({type(error).__name__}: {error})"
    else:
        reason = (
            f"the Hub refused it ({type(error).__name__}: {error}); check the token (--token, HF_TOKEN or "
            "`hf auth login`) and the repo id"
        )
    return f"could not {action}: {reason}. Nothing was uploaded, and nothing local was changed or deleted."
