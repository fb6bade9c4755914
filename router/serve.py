"""`import_path: router.serve:build`, as Serve configs written before the restructure name the app:
an entry point, like `python -m pools`, that sits above the layers and holds no logic. The app is
`isleserve.app:build` (configs/*.yaml name it); docs/architecture.md says where everything moved."""

from isleserve.app import build

__all__ = ["build"]
