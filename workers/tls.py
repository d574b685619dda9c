"""The AMQPS listener's TLS (issue 16, item 4): the server context the IO
workers wrap accepted sockets in (TLS 1.2 and 1.3), built from --tls-cert,
--tls-key and --tls-ca, built again on SIGHUP (new connections get the new
certificates; open ones keep theirs), and the user name a client
certificate gives SASL EXTERNAL (its subject's CN, RabbitMQ's
`ssl_cert_login_from = common_name`)."""

from __future__ import annotations

import ssl
from typing import Any

from shoal.broker.config import Config


def server_context(config: Config) -> ssl.SSLContext:
    """Raises OSError or ssl.SSLError for certificates that cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key or None)
    if config.tls_ca:
        context.load_verify_locations(config.tls_ca)
        # RabbitMQ's verify_peer: a certificate presented is verified; one is
        # required only with fail_if_no_peer_cert.
        context.verify_mode = (
            ssl.CERT_REQUIRED if config.tls_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
        )
    return context


def certificate_user(peercert: Any) -> str:
    """The CN of a verified client certificate's subject ("" if none)."""
    if not isinstance(peercert, dict):
        return ""
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""
