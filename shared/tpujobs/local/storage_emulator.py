"""The local Cloud Storage: gcp-storage-emulator, in memory, with two mends where it is not Google.

- In memory it still serialises every object's metadata (`.meta`, indented JSON) on every write,
  to a store it reads only when it starts: each write costs time in proportion to the objects the
  stack has made. The agents upload output chunks every few seconds, so a long test session (and
  an orbax checkpoint of many small files) slowed down as it went. In memory, that write is skipped.
- Its downloads carry no `x-goog-generation`, which Cloud Storage sends with every object's media
  (https://cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration); TensorStore's
  OCDBT driver (orbax's default format) refuses an answer without it.

    python -m tpujobs.local.storage_emulator start --host=127.0.0.1 --port=PORT --in-memory
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.storage import Storage

Handler = Callable[..., None]


def write_config_unless_in_memory(write: Callable[[Storage], None]) -> Callable[[Storage], None]:
    def write_config(self: Storage) -> None:
        if not getattr(self, "_use_memory_fs", False):
            write(self)

    return write_config


def with_generation(download: Handler) -> Handler:
    def download_with_generation(request: Any, response: Any, storage: Storage, *args: Any, **kwargs: Any) -> None:
        download(request, response, storage, *args, **kwargs)
        try:
            found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except Exception:  # the download itself answered (404): nothing to add
            return
        response["x-goog-generation"] = str(found.get("generation", ""))
        response["x-goog-metageneration"] = str(found.get("metageneration", ""))

    return download_with_generation


def patch() -> None:
    """Apply both mends; before the emulator's server module builds its routes from `objects`."""
    Storage._write_config_to_file = write_config_unless_in_memory(Storage._write_config_to_file)
    objects.download = with_generation(objects.download)


def main(argv: list[str]) -> int:
    patch()
    from gcp_storage_emulator.__main__ import main as emulator_main  # builds its routes: after `patch`

    emulator_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
