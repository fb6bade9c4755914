"""Reading a YAML file for any layer's config, with the one-line errors every CLI prints."""

from __future__ import annotations

from pathlib import Path

import yaml

from topology.errors import ParseError


def load_yaml_file(path: str, what: str) -> object:
    """The parsed document, or ParseError naming the file and what it was meant to be."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ParseError(f"cannot read {what}: {err.strerror}", path) from None
    except UnicodeDecodeError as err:
        raise ParseError(f"{what} is not UTF-8 text (byte {err.start})", path) from None
    except yaml.YAMLError as err:
        raise ParseError(f"{what} is not valid YAML ({str(err).splitlines()[0]})", path) from None
