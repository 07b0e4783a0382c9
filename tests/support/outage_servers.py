"""Loopback ``/run`` servers that are hard to reach: one behind a self-signed TLS certificate,
one that listens only part of the time (up ``up_s`` in every ``period_s``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.ports import free_port
from tests.support.scripted_gym import result_for


def self_signed_context(folder: Path) -> ssl.SSLContext:
    """A server TLS context for 127.0.0.1 with a self-signed certificate (no CA trusts it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context


@dataclass
class GradingServer:
    """Answers every ``/run`` with ``result`` graded for the instance sent, closing each
    connection after its answer (no keep-alive: every request connects anew). ``tls``: serve
    https. ``start``/``stop`` toggle the listening socket only, so it can flap."""

    result: dict[str, Any]
    tls: ssl.SSLContext | None = None
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    _flapping: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        answer = result_for(self.result, str(body.get("instance_id")))
        return web.json_response(answer, headers={"Connection": "close"})

    async def start(self) -> GradingServer:
        if self._runner is None:
            app = web.Application()
            app.router.add_post("/run", self._run)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls)
        await self._site.start()
        return self

    async def stop_listening(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None

    def flap(self, up_s: float, period_s: float) -> None:
        """From now on, listen ``up_s`` in every ``period_s`` (starting down)."""

        async def cycle() -> None:
            while True:
                await asyncio.sleep(period_s - up_s)
                await self.start()
                await asyncio.sleep(up_s)
                await self.stop_listening()

        self._flapping = asyncio.get_running_loop().create_task(cycle())

    async def close(self) -> None:
        if self._flapping is not None:
            self._flapping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flapping
        await self.stop_listening()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
