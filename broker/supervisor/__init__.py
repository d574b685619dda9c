"""The supervisor process (forks and restarts the others, owns the segment)
and the acceptor it forks (hands TCP connections to the IO workers), with
systemd's notify protocol."""
