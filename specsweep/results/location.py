"""Where results live: ``ResultsLocation``, the one object that travels from a run's parameters
(a path or URL, or a block's fields) to the store.

Its ``url`` is a path (``data/results``), a ``file://`` URL, or a URL that pyarrow opens itself
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://…``; S3 options as query parameters,
e.g. ``?endpoint_override=http://minio:9000&scheme=http``) or through fsspec (any other protocol
fsspec knows, with its package installed). Credentials come from its own fields (which the
Prefect side fills from a block) or from the environment the SDKs read (``AWS_ACCESS_KEY_ID``…).

Writes are whole-file and atomic: an object store makes an object visible only once it is
complete; on any other filesystem (a local disk, SFTP, HDFS, ...) a hidden temporary file is
written and then moved into place. Readers skip names that start with '.'.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specsweep.errors import ConfigError, StoreError
from specsweep.redact import public_url

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "data" / "results"

#: fsspec protocols of stores where an object appears whole or not at all once written (written in place).
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss"})


class ResultsFields(BaseModel):
    """A results root's fields, declared once: the location itself and the Prefect block that names one."""

    url: str = Field(str(DEFAULT_ROOT), min_length=1,
                     description="A local path (shared by the workers), file://, s3://bucket/prefix, gs://… .")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint, e.g. http://minio:9000; default AWS.")
    region: str | None = Field(None, description="Region of the bucket.")
    access_key_id: SecretStr | None = Field(None, description="Access key id; default from the environment.")
    secret_access_key: SecretStr | None = Field(None, description="Secret access key; default from the environment.")


class ResultsLocation(ResultsFields):
    """A results root (local folder or filesystem URL) with the credentials it needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def open(self) -> Location:
        return Location.open(self)


def _is_url(text: str) -> bool:
    scheme = urlsplit(text).scheme
    return len(scheme) > 1 and "://" in text  # "C:\..." is not a URL


@dataclass(frozen=True)
class Location:
    """A filesystem and a base path in it."""

    fs: pafs.FileSystem
    base: str
    url: str  # for people and artifacts: file:///abs/path or the URL as given (without its query)

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @classmethod
    def open(cls, where: ResultsLocation) -> Location:
        text = where.url
        options = where if (where.endpoint_url or where.region or where.access_key_id or where.secret_access_key) \
            else None
        if not _is_url(text) or text.startswith("file://"):
            path = Path(urlsplit(text).path if text.startswith("file://") else text).expanduser().resolve()
            return cls(pafs.LocalFileSystem(), str(path), path.as_uri())
        parts = urlsplit(text)
        shown = public_url(text)  # never user:password@ nor the query: links, artifacts and errors show it
        if parts.scheme == "s3" and options is not None:
            fs: pafs.FileSystem = pafs.S3FileSystem(
                access_key=options.access_key_id.get_secret_value() if options.access_key_id else None,
                secret_key=options.secret_access_key.get_secret_value() if options.secret_access_key else None,
                endpoint_override=options.endpoint_url, region=options.region,
                scheme=urlsplit(options.endpoint_url).scheme if options.endpoint_url else "https",
            )
            return cls(fs, (parts.netloc.rpartition("@")[2] + parts.path).rstrip("/"), shown)
        try:
            fs, base = pafs.FileSystem.from_uri(text)
        except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            fs, base = cls._fsspec(parts.scheme, text, exc)
        return cls(fs, base.rstrip("/"), shown)

    @staticmethod
    def _fsspec(protocol: str, text: str, cause: Exception) -> tuple[pafs.FileSystem, str]:
        try:
            import fsspec
            from fsspec.core import url_to_fs

            fsspec.get_filesystem_class(protocol)
            spec_fs, path = url_to_fs(text)
        except (ImportError, ValueError) as exc:
            shown = public_url(text)  # pyarrow's and fsspec's messages quote the URL as given
            raise ConfigError(
                f"results location {shown!r}: no filesystem for {protocol}:// ({str(cause).replace(text, shown)}; "
                f"fsspec: {str(exc).replace(text, shown)}). Use a local "
                "path, s3://, gs://, or install the fsspec package for that protocol."
            ) from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(spec_fs)), path

    # -- paths --------------------------------------------------------------------------------

    def path(self, relative: str) -> str:
        return f"{self.base}/{relative}" if relative else self.base

    def url_of(self, relative: str) -> str:
        return f"{self.url.rstrip('/')}/{relative}"

    # -- files ----------------------------------------------------------------------------------

    def write_bytes(self, relative: str, data: bytes) -> str:
        """Write a whole file atomically; return its path in the filesystem."""
        target = self.path(relative)
        parent = target.rsplit("/", 1)[0]
        try:
            if self.local:
                self._check_inside(parent, relative)  # before its folders are made: they would be made there
            self._makedirs(parent)
            tmp = f"{parent}/.{target.rsplit('/', 1)[1]}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
            if not self.local:
                if self.whole_objects:
                    with self.fs.open_output_stream(target) as out:  # an object appears whole or not at all
                        out.write(data)
                    return target
                try:
                    with self.fs.open_output_stream(tmp) as out:
                        out.write(data)
                    self._move(tmp, target)
                except BaseException:
                    with contextlib.suppress(Exception):
                        self.fs.delete_file(tmp)
                    raise
                return target
            self._check_inside(parent, relative)  # and again, once they exist
            try:
                # Created here, never through a link someone placed at its name.
                with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)  # replaces a link at the target itself, never what it points to
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as exc:
            raise StoreError(
                f"cannot write results to {self.url_of(relative)}: {getattr(exc, 'strerror', None) or exc}. Earlier "
                "results are intact; free space or fix permissions on the results location (or choose another)."
            ) from None
        return target

    def _check_inside(self, parent: str, relative: str) -> None:
        """A local write's folder is inside the results location once links are resolved: in a shared results
        folder, another user's symbolic link (``runs -> /home/me/.config``) must not take the write elsewhere."""
        real = os.path.realpath(parent)
        if real != self.base and not real.startswith(self.base.rstrip("/") + "/"):
            raise StoreError(f"cannot write results to {self.url_of(relative)}: a folder on the way is a symbolic "
                             f"link out of the results location (to {real}); remove the link")

    @property
    def _spec(self) -> Any:
        """The fsspec filesystem behind pyarrow's, or None."""
        return getattr(getattr(self.fs, "handler", None), "fs", None)

    @property
    def whole_objects(self) -> bool:
        """An object store: a written object appears whole or not at all."""
        if isinstance(self.fs, (pafs.S3FileSystem, pafs.GcsFileSystem)):
            return True
        protocols = getattr(self._spec, "protocol", ())
        protocols = {protocols} if isinstance(protocols, str) else set(protocols or ())
        return bool(protocols & OBJECT_STORES)

    def _move(self, tmp: str, target: str) -> None:
        """``tmp`` onto ``target``, replacing it (through fsspec's own mv where fsspec serves: pyarrow's move
        passes it an argument that SFTP's lacks)."""
        def move() -> None:
            if self._spec is not None:
                self._spec.mv(tmp, target)
            else:
                self.fs.move(tmp, target)
        try:
            move()
        except OSError:  # a rename that does not replace (SFTP v3, HDFS): a moment without the file, never half of it
            if self.fs.get_file_info(target).type == pafs.FileType.NotFound:
                raise
            self.fs.delete_file(target)
            move()

    def _makedirs(self, path: str) -> None:
        if self.local:
            os.makedirs(path, exist_ok=True)  # errors name the errno ("Read-only file system")
        else:
            self.fs.create_dir(path, recursive=True)

    def read_bytes(self, relative: str) -> bytes:
        try:
            with self.fs.open_input_file(self.path(relative)) as f:
                return bytes(f.read())
        except (FileNotFoundError, OSError) as exc:
            raise StoreError(f"cannot read {self.url_of(relative)}: {exc}") from None

    def list_files(self, relative: str, suffix: str = "") -> list[str]:
        """Files directly under a folder (sorted, hidden ones skipped); empty when it does not exist."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(relative), allow_not_found=True))
        except OSError as exc:
            raise StoreError(f"cannot list {self.url_of(relative)}: {exc}") from None
        names = [i.base_name for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith(".")
                 and i.base_name.endswith(suffix)]
        return sorted(f"{relative}/{n}" for n in names)

    def list_dirs(self, relative: str) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(relative), allow_not_found=True))
        except OSError as exc:
            raise StoreError(f"cannot list {self.url_of(relative)}: {exc}") from None
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(self.path(relative)).type != pafs.FileType.NotFound

    def check_writable(self) -> None:
        """Fail early, before a server is started, when the location cannot be written."""
        probe = f".write-probe-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            self._makedirs(self.base)
            if self.local:
                with os.fdopen(os.open(self.path(probe), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW), "wb") as f:
                    f.write(b"ok")
                os.unlink(self.path(probe))
            else:
                with self.fs.open_output_stream(self.path(probe)) as out:
                    out.write(b"ok")
                self.fs.delete_file(self.path(probe))
        except OSError as exc:
            raise StoreError(
                f"the results location {self.url} is not writable: {getattr(exc, 'strerror', None) or exc}"
            ) from None
