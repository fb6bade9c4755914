"""What the controller keeps: its private state directory (`files`), the state a restart resumes
from (`saved`), saving without stopping (`persist`), its event log (`events`), alerts for what
it cannot write (`alarms`), links marked by an operator (`marks`) and the engines' secrets
(`secrets`)."""
