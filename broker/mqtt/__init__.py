"""MQTT 3.1.1 and 5.0 (issue 41): the packets (`packets.py`, sans IO)."""
