"""The web processes' side of the certificate signer (``nodes.access.signer``, where the design is):
ask the ``signer`` queue for a certificate of a key this process made, or for the user
CA's public key, and wait a little for the answer.

Used where ``GANTRY_CA_KEY_ACCESS=signer``: ``nodes.access.cluster`` puts ``remote_signer``
in the certificate spec of every login as a user, so log streaming, cancel, hold and every
other page that acts as a researcher's account gets its certificate from a worker; the
key's private half never leaves this process.
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery import current_app
from celery.exceptions import TimeoutError as CeleryTimeoutError
from django.conf import settings

from controlplane.tasknames import USER_CA_ENSURE, USER_CERTIFICATE_SIGN
from slurm.certificates import CertificateSpec
from slurm.errors import SshConfigurationError, SshTransientError

# What a certificate the web asks for is for: the signer grants only this purpose, and
# names it in the certificate's key id (sshd logs it with every login).
PURPOSE_WEB = "web"


def ask_signer(task_name: str, **arguments: Any) -> dict[str, Any]:
    """Ask the signer (``task_name`` on the signer queue) and wait for its answer. No
    answer, or no broker: ``SshTransientError``; a refusal: ``SshConfigurationError`` with
    the signer's reason (``SshTransientError`` when it says retrying may help)."""
    answer = signer_round_trip(task_name, arguments)
    if not isinstance(answer, dict):
        raise SshConfigurationError(f"the certificate signer answered {answer!r}")
    if answer.get("refused"):
        error_class = SshTransientError if answer.get("transient") else SshConfigurationError
        raise error_class(f"the certificate signer refused: {answer['refused']}")
    return answer


def signer_round_trip(task_name: str, arguments: dict[str, Any]) -> Any:
    """Send the task (routed to the signer queue by name) and wait at most the SSH connect
    timeout for what it returns."""
    try:
        result = current_app.send_task(task_name, kwargs=arguments)
    except Exception as error:
        raise SshTransientError(f"cannot reach the certificate signer: {error}") from None
    wait = settings.SSH_CONNECT_TIMEOUT
    try:
        return result.get(timeout=wait)
    except CeleryTimeoutError:
        raise SshTransientError(
            f"no answer from the certificate signer within {wait}s (is a Celery worker "
            f"consuming the {settings.SIGNER_QUEUE!r} queue?)"
        ) from None
    except Exception as error:
        raise SshTransientError(f"the certificate signer failed: {error}") from None
    finally:
        # The answer is no secret (a certificate is useless without its key), but it need
        # not wait in the result store for an hour either.
        with contextlib.suppress(Exception):
            result.forget()


def remote_signer(spec: CertificateSpec, public_key: str) -> str:
    """A ``Signer``: the certificate for ``public_key`` (an OpenSSH public key line) as
    ``spec.account`` on ``spec.cluster``, from the signer. Only the names travel: the
    signer reads everything else (principal, validity, source addresses) from its own
    database, and ``certificates.check_signed`` holds the answer to the spec."""
    answer = ask_signer(
        USER_CERTIFICATE_SIGN,
        cluster=spec.cluster,
        account=spec.account,
        public_key=public_key,
        purpose=PURPOSE_WEB,
    )
    return str(answer.get("certificate", ""))


def remote_user_ca_ensure(cluster_id: int) -> tuple[str, bool]:
    """The cluster's user CA public key line, the signer making the CA if there is none,
    and whether it did."""
    answer = ask_signer(USER_CA_ENSURE, cluster_id=cluster_id)
    return str(answer.get("public_key", "")), bool(answer.get("created"))
