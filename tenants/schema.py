"""OpenAPI description of the bearer-token authentication (loaded by ``TenantsConfig.ready``)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gpub_<prefix>_<secret>",
                "description": "An API token of the tenant (create one under /api/v1/tokens; shown once)."}
