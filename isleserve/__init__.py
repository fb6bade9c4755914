"""The product: the Ray Serve application (`app`, `import_path: isleserve.app:build` in
configs/*.yaml), the one settings schema of a deployment (`settings`), `isle run` with its own
locked-down Ray (`run`, `raylocal`, `raysecurity`) and `isle status`. Composes the router and
the control plane; imports every layer below it, never `loadtest`."""
