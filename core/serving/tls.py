"""``engine serve`` over TLS: the --ssl-* options (uvicorn's, as vLLM passes them on), checked before the model
loads so that a wrong path or a key that does not match its certificate is one line, not a traceback later."""

from __future__ import annotations

import os
import ssl

# --ssl-cert-reqs: what the server asks of clients, as the ssl module numbers it
CERT_REQS = {0: "none (no client certificate)", 1: "optional (checked when sent)",
             2: "required (mutual TLS: every client presents a certificate signed by --ssl-ca-certs)"}


class TLSConfigError(ValueError):
    """A --ssl-* option that cannot work; the message says which and what to do."""


def add_arguments(p) -> None:
    p.add_argument("--ssl-keyfile", help="serve HTTPS: the server's private key (PEM); needs --ssl-certfile")
    p.add_argument("--ssl-certfile", help="serve HTTPS: the server's certificate chain (PEM); needs --ssl-keyfile")
    p.add_argument("--ssl-ca-certs", help="CA certificates (PEM) that client certificates must be signed by")
    p.add_argument("--ssl-cert-reqs", type=int, default=0, choices=sorted(CERT_REQS),
                   help="client certificates: " + "; ".join(f"{k} = {v}" for k, v in CERT_REQS.items()))


def uvicorn_options(args) -> dict:
    """uvicorn.Config's ssl_* keywords for the parsed options ({} without TLS), after checking that they make a
    working server context (files readable, key matching certificate, a CA where client certificates are asked)."""
    key, cert, ca, reqs = args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs, args.ssl_cert_reqs
    if not key and not cert:
        if ca or reqs:
            raise TLSConfigError("--ssl-ca-certs and --ssl-cert-reqs need TLS on: give --ssl-keyfile and "
                                 "--ssl-certfile too")
        return {}
    if not (key and cert):
        raise TLSConfigError("TLS needs both --ssl-keyfile and --ssl-certfile (the private key and its certificate)")
    for flag, path in (("--ssl-keyfile", key), ("--ssl-certfile", cert), ("--ssl-ca-certs", ca)):
        if path and not os.access(path, os.R_OK):
            raise TLSConfigError(f"{flag} {path}: no such readable file")
    if reqs and not ca:
        raise TLSConfigError(f"--ssl-cert-reqs {reqs} asks clients for certificates: give --ssl-ca-certs, the CA "
                             "file they are checked against")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TLSConfigError(f"--ssl-certfile {cert} and --ssl-keyfile {key} make no server identity "
                             f"({exc.reason or exc}): are they PEM, the key unencrypted and that certificate's?"
                             ) from exc
    if ca:
        try:
            context.load_verify_locations(ca)
        except ssl.SSLError as exc:
            raise TLSConfigError(f"--ssl-ca-certs {ca}: not PEM CA certificates ({exc.reason or exc})") from exc
    return {"ssl_keyfile": key, "ssl_certfile": cert, "ssl_ca_certs": ca, "ssl_cert_reqs": reqs}
