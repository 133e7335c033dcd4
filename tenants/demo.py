"""The demo's tenants, projects, quotas and members (``manage.py seed_demo``), as plain data: ``make run``
reads it before Django is set up, to print the demo logins last in its banner."""

DEMO = {
    "acme": {
        "name": "Acme Research", "currency": "USD",
        "quotas": {"H100-80GB": (16000, 24000), "A100-80GB": (8000, 16000), "L4": (4000, 8000)},
        "projects": {
            "vision": ("Vision models", {"H100-80GB": (8000, 16000, 2), "A100-80GB": (4000, 8000, 1)}),
            "llm": ("LLM fine-tuning", {"H100-80GB": (8000, 24000, 3), "L4": (4000, 8000, 1)}),
        },
        "members": {"alice": "owner", "adam": "member", "vera": "viewer"},
    },
    "globex": {
        "name": "Globex AI", "currency": "EUR",
        "quotas": {"H100-80GB": (8000, 16000), "L4": (8000, 8000)},
        "projects": {
            "inference": ("Inference fleet", {"L4": (8000, 8000, 1), "H100-80GB": (2000, 8000, 1)}),
            "research": ("Research", {"H100-80GB": (6000, 16000, 1)}),
        },
        "members": {"carol": "owner", "dan": "member"},
    },
}

# make run's single sign-on demo (README "Single sign-on"): globex signs in through the local OpenID provider that
# make run starts (infra/oidc_provider); carol and dan exist already (their e-mail matches), grace is made a member
# just in time at her first sign-in, an admin through her group. Their password at the provider: the demo users'.
SSO_DEMO = {
    "tenant": "globex", "provider_name": "Local OpenID provider", "client_id": "gpubroker-demo",
    "domain": "globex.example", "group_roles": {"gpu-admins": "admin"},
    "users": {"carol": "", "dan": "", "grace": "gpu-admins"},
}
