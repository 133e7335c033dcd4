"""Schemathesis hooks (``SCHEMATHESIS_HOOKS``) for tests/api/test_schemathesis.py.

The fuzzer acts with an owner's token; it must not revoke that token or change that membership, or every
later request would be a 401/403 and the run would test nothing. Their ids come in the environment.
"""

import os

import schemathesis

_PROTECTED = {
    "/api/v1/tokens/{id}": os.environ.get("ST_PROTECTED_TOKEN_ID", ""),
    "/api/v1/members/{id}": os.environ.get("ST_PROTECTED_MEMBER_ID", ""),
}


@schemathesis.hook
def filter_case(context, case):
    protected = _PROTECTED.get(case.path)
    if protected and case.method.upper() in ("DELETE", "PATCH"):
        return str((case.path_parameters or {}).get("id")) != protected
    return True
