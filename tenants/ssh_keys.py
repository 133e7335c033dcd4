"""Users' SSH public keys: how a tenant's members reach their leases through the broker's SSH gateway
(``broker.ssh_gateway``; docs/leasing.md, "SSH"). A key is the user's own credential, like their password or a token:
they add and remove theirs (the API, Settings → SSH keys), staff remove one in the admin; each change is audited
in the tenant the user acted from. Only public keys are taken (a private key pasted by mistake is refused and never
stored or echoed); ed25519, ECDSA and RSA of at least 2,048 bits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncssh
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.errors import Conflict, NotFound, ValidationFailed
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import SshKey

MAX_KEYS_PER_USER = 20
ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa",
              "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
MIN_RSA_BITS = 2048
USED_GRANULARITY = timedelta(minutes=1)  # last use written at most once a minute, as a token's


def public_key_parse(text: object) -> tuple[str, str]:
    """``(normalised public key, SHA256 fingerprint)`` of an OpenSSH public key line, or the field's error."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed("public_key: paste one OpenSSH public key (the line in ~/.ssh/id_ed25519.pub).",
                               field="public_key")
    text = text.strip()
    if "PRIVATE KEY" in text:
        raise ValidationFailed("public_key: that is a private key; never share it. Paste the .pub file's line.",
                               field="public_key")
    if len(text) > 16384 or "\n" in text:
        raise ValidationFailed("public_key: one key on one line, at most 16 KiB.", field="public_key")
    try:
        key = asyncssh.import_public_key(text)
    except (asyncssh.KeyImportError, ValueError, TypeError):
        raise ValidationFailed("public_key: not an OpenSSH public key ('ssh-ed25519 AAAA…').",
                               field="public_key") from None
    algorithm = key.get_algorithm()
    if algorithm not in ALGORITHMS:
        raise ValidationFailed(f"public_key: {algorithm} keys are not accepted; use ssh-ed25519, ECDSA or RSA.",
                               field="public_key")
    if algorithm == "ssh-rsa" and key.pyca_key.key_size < MIN_RSA_BITS:
        raise ValidationFailed(f"public_key: an RSA key needs at least {MIN_RSA_BITS} bits.", field="public_key")
    normalised = key.export_public_key("openssh").decode().split()[:2]
    return " ".join(normalised), key.get_fingerprint("sha256")


def ssh_key_list(*, actor: Actor) -> QuerySet[SshKey]:
    """The acting user's own keys, newest first."""
    return SshKey.objects.filter(user=actor.user).order_by("-created_at", "-id")


def ssh_key_get(*, actor: Actor, pk: int) -> SshKey:
    key = ssh_key_list(actor=actor).filter(pk=pk).first()
    if key is None:
        raise NotFound("No such SSH key of yours.")
    return key


def ssh_key_add(*, actor: Actor, name: object, public_key: object) -> SshKey:
    """Add a public key to the acting user (``self``: not by a read-only or project-limited token, not while the
    tenant is suspended). A key already on file (anyone's) is refused without saying whose."""
    actor.require("self")
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
        raise ValidationFailed("name must be 1-100 characters.", field="name")
    normalised, fingerprint = public_key_parse(public_key)
    try:
        with transaction.atomic(durable=True):
            if SshKey.objects.select_for_update().filter(user=actor.user).count() >= MAX_KEYS_PER_USER:
                raise Conflict(f"You have {MAX_KEYS_PER_USER} SSH keys; remove one first.", field="public_key")
            key = SshKey.objects.create(user=actor.user, name=name.strip(), public_key=normalised,
                                        fingerprint=fingerprint)
            audit_record(tenant=actor.tenant, by=actor, action="ssh_key.add", target=fingerprint,
                         data={"name": key.name, "algorithm": normalised.split()[0]})
    except IntegrityError:
        raise Conflict("This key is already registered; a key names one user. Make a new one for this account.",
                       field="public_key") from None
    return key


def ssh_key_remove(*, actor: Actor, key: SshKey) -> None:
    """Remove one of the acting user's keys (``leave``: allowed while suspended and with any write token)."""
    actor.require("leave")
    with transaction.atomic(durable=True):
        removed, _ = SshKey.objects.filter(pk=key.pk, user=actor.user).delete()
        if removed:
            audit_record(tenant=actor.tenant, by=actor, action="ssh_key.remove", target=key.fingerprint,
                         data={"name": key.name})


def ssh_key_remove_by_staff(*, key: SshKey, by_user) -> None:
    """Staff remove a user's key (a lost laptop), from the admin; audited as a platform event."""
    with transaction.atomic(durable=True):
        removed, _ = SshKey.objects.filter(pk=key.pk).delete()
        if removed:
            audit_record(tenant=None, by=by_user, action="ssh_key.remove", target=key.fingerprint,
                         data={"name": key.name, "user": key.user.get_username(), "by_staff": True})


def ssh_key_for_fingerprint(fingerprint: str) -> SshKey | None:
    """The key with this fingerprint and its user (the gateway's lookup), or None; an inactive user's is None."""
    key = SshKey.objects.select_related("user").filter(fingerprint=fingerprint).first()
    if key is None or not key.user.is_active:
        return None
    return key


def ssh_key_mark_used(*, key: SshKey, now: datetime | None = None) -> None:
    now = now or timezone.now()
    SshKey.objects.filter(pk=key.pk).exclude(last_used_at__gt=now - USED_GRANULARITY).update(last_used_at=now)
