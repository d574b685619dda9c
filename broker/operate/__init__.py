"""The operator's verbs: `shoal status` and `shoal consumers` (status),
`shoal ctl` (ctl: rabbitmqctl's verbs over the scheduler's control socket,
a cluster's over its node's agent) and `shoal policy` (policy). They read
the segment and write through the control sockets; the metrics, which only
read, are broker/observe/."""
