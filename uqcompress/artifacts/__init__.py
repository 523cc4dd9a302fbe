"""Artifact directories: manifest schema, atomic writer, verifying reader, lineage."""

from uqcompress.artifacts.manifest import MANIFEST_NAME, InputRef, Manifest
from uqcompress.artifacts.reader import Artifact, open_artifact, read_manifest, verify_files
from uqcompress.artifacts.writer import (
    ArtifactWriter,
    OutputPlan,
    SourceRef,
    clean_stale_temp_dirs,
    default_root,
    resolve_destination,
)

__all__ = [
    "MANIFEST_NAME",
    "Artifact",
    "ArtifactWriter",
    "InputRef",
    "Manifest",
    "OutputPlan",
    "SourceRef",
    "clean_stale_temp_dirs",
    "default_root",
    "open_artifact",
    "read_manifest",
    "resolve_destination",
    "verify_files",
]
