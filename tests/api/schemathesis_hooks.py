"""Schemathesis hooks (``SCHEMATHESIS_HOOKS``) for tests/api/test_schemathesis.py.

The fuzzer acts with an owner's token; it must not revoke the seeded tokens or change the seeded
memberships: with the owner's gone every later request would be a 401/403 and the run would test nothing,
with the viewer's the hand-written 403 cases would answer 401. Their ids come in the environment.
"""

import os

import schemathesis

_PROTECTED = {  # comma-separated ids
    "/api/v1/tokens/{id}": set(os.environ.get("ST_PROTECTED_TOKEN_IDS", "").split(",")),
    "/api/v1/members/{id}": set(os.environ.get("ST_PROTECTED_MEMBER_IDS", "").split(",")),
}


@schemathesis.hook
def filter_case(context, case):
    protected = _PROTECTED.get(case.path)
    if protected and case.method.upper() in ("DELETE", "PATCH"):
        return str((case.path_parameters or {}).get("id")) not in protected
    return True
