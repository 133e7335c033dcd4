"""A tiny OpenID provider for the tests and ``make run``'s demo: django-oauth-toolkit with OpenID Connect on
(RS256 signing key, discovery at ``/o/.well-known/openid-configuration``, JWKS, userinfo), its own SQLite file,
its own users. It is a real provider speaking the real protocol over HTTP on a loopback port; it is not part of
the broker and never runs in production (point a tenant at the organisation's own provider there: README,
docs/tenancy.md).

Started as ``python -m infra.oidc_provider --port P --data DIR --client-id ID --client-secret S
--redirect-uri URI --user NAME:PASSWORD:EMAIL[:GROUP,GROUP]...`` (``__main__``). Two test users misbehave on
purpose (``validator.py``): ``wrong-audience`` gets ID tokens issued for another client, ``expired`` gets ID
tokens that expired an hour ago, so the broker's refusals are tested against signed tokens from a real provider.
"""
