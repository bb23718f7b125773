"""``engine serve`` over TLS, mutual TLS included: certificates made by openssl in the test, a real TLS client."""

from __future__ import annotations

import argparse
import shutil
import ssl
import subprocess
import sys
import time

import httpx
import pytest

from engine.core.serving import tls
from tests import needs
from tests.core.serving.live_server import free_port
from tests.plugin_helpers import REPO, run_engine

if shutil.which("openssl") is None:  # .ci/run installs it; elsewhere say so instead of passing quietly
    pytest.skip("the openssl command makes these tests' certificates: apt-get install openssl", allow_module_level=True)


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d, name: str, cn: str, san: str | None) -> None:
    """name.key and name.pem, an EC key and its certificate signed by the test CA."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "1", "-extfile", str(ext), cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=engine test CA", cwd=d)
    _issue(d, "server", "localhost", "DNS:localhost,IP:127.0.0.1")
    _issue(d, "client", "a client", None)
    return d


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"ssl_keyfile": None, "ssl_certfile": None, "ssl_ca_certs": None,
                                 "ssl_cert_reqs": 0, **kw})


def test_tls_options_are_checked_before_serving(pki):
    key, cert, ca = str(pki / "server.key"), str(pki / "server.pem"), str(pki / "ca.pem")
    assert tls.uvicorn_options(_args()) == {}
    assert tls.uvicorn_options(_args(ssl_keyfile=key, ssl_certfile=cert))["ssl_certfile"] == cert
    bad = {
        "both": _args(ssl_keyfile=key),
        "need TLS on": _args(ssl_ca_certs=ca),
        "no such readable file": _args(ssl_keyfile=key, ssl_certfile=str(pki / "nope.pem")),
        "give --ssl-ca-certs": _args(ssl_keyfile=key, ssl_certfile=cert, ssl_cert_reqs=2),
        "make no server identity": _args(ssl_keyfile=str(pki / "client.key"), ssl_certfile=cert),
        "not PEM CA certificates": _args(ssl_keyfile=key, ssl_certfile=cert, ssl_ca_certs=str(pki / "server.ext")),
    }
    for message, args in bad.items():
        with pytest.raises(tls.TLSConfigError, match=message):
            tls.uvicorn_options(args)


def test_a_bad_tls_option_is_one_line_before_the_model_loads(pki):
    start = time.monotonic()
    proc = run_engine(["serve", "--port", str(free_port()), "--ssl-keyfile", str(pki / "server.key")])
    assert proc.returncode == 2 and "--ssl-certfile" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = run_engine(["serve", "--port", str(free_port()), "--key-health-and-metrics"])
    assert proc.returncode == 2 and "needs --api-key" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60


def _client_context(pki, with_certificate: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if with_certificate:
        ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    return ctx


@pytest.mark.usefixtures("default_model")
def test_mutual_tls_serves_only_clients_with_a_certificate(pki):
    openai = needs.module("openai")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.core.cli", "serve", "--port", str(port), "--max-model-len", "256",
         "--served-model-name", "tiny", "--log-level", "warning", "--api-key", "sekret", "--key-health-and-metrics",
         "--ssl-keyfile", str(pki / "server.key"), "--ssl-certfile", str(pki / "server.pem"),
         "--ssl-ca-certs", str(pki / "ca.pem"), "--ssl-cert-reqs", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url, key = f"https://localhost:{port}", {"Authorization": "Bearer sekret"}
    trusted = httpx.Client(verify=_client_context(pki, True), timeout=30)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            try:
                if trusted.get(f"{url}/health", headers=key).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert trusted.get(f"{url}/health").status_code == 401  # keyed by --key-health-and-metrics
        assert trusted.get(f"{url}/metrics").status_code == 401
        assert "engine_requests_total" in trusted.get(f"{url}/metrics", headers=key).text
        with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
            httpx.get(f"{url}/health", headers=key, verify=_client_context(pki, False), timeout=10)
        with pytest.raises(httpx.HTTPError):  # the server is not trusted without the test CA
            httpx.get(f"{url}/health", headers=key, timeout=10)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://localhost:{port}/health", headers=key, timeout=10)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", max_retries=0,
                           http_client=httpx.Client(verify=_client_context(pki, True), timeout=60)) as client:
            r = client.chat.completions.create(model="tiny", temperature=0, max_tokens=12, messages=[
                {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in r.choices[0].message.content
    finally:
        trusted.close()
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert f"https://127.0.0.1:{port}/v1" in out, out
    assert proc.returncode == 0 and "Traceback" not in err, err
