"""Where a run keeps its results, readable by every worker: the results location as a Prefect block.

    ResultsLocation(url="s3://bench-results/specsweep", endpoint_url="http://minio:9000",
                    access_key_id="...", secret_access_key="...").save("shared-results")
    # then, in a run's parameters: benchmark.results_block = "shared-results"

The same object serves twice: the Parquet store writes the datasets under ``url``, and
Prefect keeps the benchmark tasks' persisted results under ``url/.prefect-results/``, so
a retried flow run that lands on another worker still finds the levels that finished.
Without a block, the location is the ``benchmark.results`` path or URL (credentials from
the environment).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from prefect._internal.compatibility.async_dispatch import async_dispatch
from prefect.filesystems import WritableFileSystem
from pydantic import Field, SecretStr

from specsweep.storage import Location, StorageOptions

RESULTS_SUBDIR = ".prefect-results"


class ResultsLocation(WritableFileSystem):
    """A results root (local folder or filesystem URL) with the credentials it needs."""

    _block_type_name = "specsweep results"
    _block_type_slug = "specsweep-results"
    _description = "Where specsweep keeps its Parquet results and Prefect's persisted task results."

    url: str = Field(description="A local path (shared by the workers), file://, s3://bucket/prefix, gs://… .")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, Ceph…); default AWS.")
    region: str | None = Field(None, description="Bucket region.")
    access_key_id: SecretStr | None = Field(None, description="Access key id; default from the worker's environment.")
    secret_access_key: SecretStr | None = Field(None, description="Secret access key; default from the environment.")

    def storage_options(self) -> StorageOptions | None:
        if not (self.endpoint_url or self.region or self.access_key_id or self.secret_access_key):
            return None
        return StorageOptions(endpoint_url=self.endpoint_url, region=self.region, access_key_id=self.access_key_id,
                              secret_access_key=self.secret_access_key)

    def _results(self) -> Location:
        base = self.url.rstrip("/")
        return Location.open(f"{base}/{RESULTS_SUBDIR}", self.storage_options())

    # Prefect's result store calls these to persist and find task results (as its own
    # LocalFileSystem does: an async method, and a sync one that dispatches to it from async code).
    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self._results().read_bytes, path)

    @async_dispatch(aread_path)
    def read_path(self, path: str) -> bytes:  # type: ignore[override]  # as Prefect's LocalFileSystem does
        return self._results().read_bytes(path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self._results().write_bytes, path, content)

    @async_dispatch(awrite_path)
    def write_path(self, path: str, content: bytes) -> str:  # type: ignore[override]  # as LocalFileSystem does
        return self._results().write_bytes(path, content)


async def result_storage(results: ResultsLocation) -> ResultsLocation | Path:
    """What Prefect persists the benchmark tasks' results to, under the results root: a folder for a
    local root (shared by the workers that use it), else the block itself. Prefect takes only saved
    blocks there, so a URL given as a plain parameter is saved once as ``auto-<digest>`` (its
    credentials, if any, stay in the workers' environment)."""
    location = Location.open(results.url, results.storage_options())
    if location.local:
        return Path(location.base) / RESULTS_SUBDIR
    if getattr(results, "_block_document_id", None) is None:
        name = "auto-" + hashlib.sha256(results.url.encode()).hexdigest()[:16]
        await results.asave(name, overwrite=True)
    return results


async def aresolve_results(results: str, results_block: str | None) -> ResultsLocation:
    """The results location of a run: the named block, else the path or URL parameter."""
    if results_block:
        from specsweep.errors import ConfigError

        try:
            block = await ResultsLocation.aload(results_block)
        except ValueError as exc:
            raise ConfigError(
                f"benchmark.results_block: there is no specsweep-results block named {results_block!r} ({exc}). "
                "Create it (ResultsLocation(url=...).save(name)) or fix the name."
            ) from None
        return block
    return ResultsLocation(url=results)
