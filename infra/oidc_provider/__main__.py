"""Prepare (key, database, client, users) and serve the local OpenID provider on 127.0.0.1 (see __init__)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path


def _prepare_files(data: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    data.mkdir(parents=True, exist_ok=True)
    if not (data / "django-secret").exists():
        (data / "django-secret").write_text(secrets.token_urlsafe(48))
    if not (data / "oidc-rsa.pem").exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (data / "oidc-rsa.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    for name in ("django-secret", "oidc-rsa.pem"):
        os.chmod(data / name, 0o600)


def _prepare_database(args) -> None:
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0, interactive=False)
    Application.objects.filter(client_id=args.client_id).delete()
    Application.objects.create(
        name="gpubroker", client_id=args.client_id, client_secret=args.client_secret,
        client_type=Application.CLIENT_CONFIDENTIAL, authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(args.redirect_uri), algorithm=Application.RS256_ALGORITHM, skip_authorization=True,
        post_logout_redirect_uris=" ".join(args.redirect_uri))
    for spec in args.user:
        name, password, email, *rest = spec.split(":")
        user, _ = User.objects.get_or_create(username=name)
        user.email = email
        user.set_password(password)
        user.save()
        user.groups.set([Group.objects.get_or_create(name=group)[0] for group in (rest[0].split(",") if rest and
                                                                                  rest[0] else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.oidc_provider", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True, help="folder for its key and SQLite database")
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", help="or client_secret in --config")
    parser.add_argument("--redirect-uri", action="append", required=True)
    parser.add_argument("--user", action="append", default=[], help="NAME:PASSWORD:EMAIL[:GROUP,GROUP]")
    parser.add_argument("--config", type=Path, help='a JSON file {"client_secret": ..., "users": ["NAME:PASSWORD:'
                                                    'EMAIL[:GROUPS]", ...]}: secrets kept off the command line')
    args = parser.parse_args(argv)
    if args.config:
        import json

        config = json.loads(args.config.read_text())
        args.client_secret = args.client_secret or config.get("client_secret")
        args.user += config.get("users", [])
    if not args.client_secret:
        parser.error("--client-secret or a --config with client_secret is needed")
    _prepare_files(args.data)
    os.environ["OIDC_PROVIDER_DATA"] = str(args.data)
    os.environ["DJANGO_SETTINGS_MODULE"] = "infra.oidc_provider.settings"
    import django
    from django.core.management import call_command

    django.setup()
    _prepare_database(args)
    print(f"OpenID provider at http://127.0.0.1:{args.port}/o", flush=True)
    call_command("runserver", f"127.0.0.1:{args.port}", use_reloader=False, skip_checks=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
