"""From a placement to a running replica: its launch (`build`), a gang's ranks (`gang`) and the
engine ports of a node (`portbook`)."""
