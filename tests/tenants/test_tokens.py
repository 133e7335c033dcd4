from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from tenants.models import ApiToken, Membership
from tenants.tokens import token_hash, token_parse_prefix
from tests.factories import api_client, make_member, make_tenant, make_token


@pytest.fixture
def acme_alice(db):
    acme = make_tenant("acme")
    return acme, make_member(acme, "alice", "owner")


def test_token_stored_only_as_hash(acme_alice):
    acme, alice = acme_alice
    token, secret = make_token(acme, alice)
    stored = ApiToken.objects.get(pk=token.pk)
    assert secret not in {stored.secret_hash, stored.prefix, stored.name}
    assert stored.secret_hash == token_hash(secret)
    assert token_parse_prefix(secret) == stored.prefix
    assert secret.startswith(f"gpub_{stored.prefix}_")


def test_token_authenticates_and_records_last_use(acme_alice):
    acme, alice = acme_alice
    token, secret = make_token(acme, alice)
    response = api_client(secret).get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json()["slug"] == "acme" and response.json()["role"] == "owner"
    token.refresh_from_db()
    first_use = token.last_used_at
    assert first_use is not None
    api_client(secret).get("/api/v1/tenant")  # within a minute: no write per request
    token.refresh_from_db()
    assert token.last_used_at == first_use


@pytest.mark.parametrize("header", ["Bearer nonsense", "Bearer gpub_abcdefghij_wrongsecret", "Bearer "])
def test_token_invalid_is_401_problem(acme_alice, header):
    client = api_client()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/tenant")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_token_with_right_prefix_wrong_secret_is_refused(acme_alice):
    acme, alice = acme_alice
    token, _secret = make_token(acme, alice)
    forged = f"gpub_{token.prefix}_" + "x" * 43
    assert api_client(forged).get("/api/v1/tenant").status_code == 401


def test_token_revoked_stops_working_and_revoke_is_idempotent(acme_alice):
    acme, alice = acme_alice
    token, secret = make_token(acme, alice)
    client = api_client(secret)
    _other, other_secret = make_token(acme, alice, name="second")
    assert api_client(other_secret).delete(f"/api/v1/tokens/{token.pk}").status_code == 200
    response = client.get("/api/v1/tenant")
    assert response.status_code == 401 and "revoked" in response.json()["detail"]
    again = api_client(other_secret).delete(f"/api/v1/tokens/{token.pk}")
    assert again.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_token_expired_is_refused(acme_alice):
    acme, alice = acme_alice
    _, secret = make_token(acme, alice, expires_at=timezone.now() + timedelta(hours=1))
    assert api_client(secret).get("/api/v1/tenant").status_code == 200
    with time_machine.travel(timezone.now() + timedelta(hours=2)):
        response = api_client(secret).get("/api/v1/tenant")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_token_dies_with_membership(acme_alice):
    acme, _alice = acme_alice
    bob = make_member(acme, "bob", "member")
    _, secret = make_token(acme, bob)
    Membership.objects.filter(user=bob).delete()
    assert api_client(secret).get("/api/v1/tenant").status_code == 401


def test_token_create_shows_secret_once(acme_alice):
    acme, alice = acme_alice
    _, secret = make_token(acme, alice)
    client = api_client(secret)
    created = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read"]}, format="json")
    assert created.status_code == 201
    new_secret = created.json()["token"]
    assert api_client(new_secret).get("/api/v1/tenant").status_code == 200
    listed = client.get("/api/v1/tokens").json()["results"]
    assert all("token" not in item for item in listed)
    detail = client.get(f"/api/v1/tokens/{created.json()['id']}").json()
    assert "token" not in detail and detail["prefix"] == token_parse_prefix(new_secret)


def test_token_create_rejects_past_expiry_naming_field(acme_alice):
    acme, alice = acme_alice
    _, secret = make_token(acme, alice)
    response = api_client(secret).post(
        "/api/v1/tokens", {"name": "ci", "scopes": ["read"], "expires_at": "2001-01-01T00:00:00Z"}, format="json"
    )
    assert response.status_code == 400 and response.json()["field"] == "expires_at"
