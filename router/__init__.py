"""The data plane: OpenAI API, SLO classes, routing plugins, PD orchestration, metrics. Built on
`pools` and `topology`; the router issue fills it in."""

import pools  # noqa: F401  (pools decides first whether the request path runs compiled)
