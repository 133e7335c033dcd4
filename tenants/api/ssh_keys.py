"""``/api/v1/ssh-keys``: the acting user's SSH public keys, for the broker's SSH gateway (docs/leasing.md, "SSH")."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants import ssh_keys
from tenants.api.serializers import StrictSerializer
from tenants.models import SshKey


class SshKeyOutput(serializers.ModelSerializer):
    algorithm = serializers.SerializerMethodField()

    class Meta:
        model = SshKey
        fields = ["id", "name", "algorithm", "fingerprint", "public_key", "created_at", "last_used_at"]

    def get_algorithm(self, key: SshKey) -> str:
        return key.public_key.split(" ", 1)[0]


class SshKeyCreateInput(StrictSerializer):
    name = serializers.CharField(max_length=100, help_text="A name you will recognise (the laptop it lives on).")
    public_key = serializers.CharField(max_length=16384, trim_whitespace=True,
                                       help_text="One OpenSSH public key line ('ssh-ed25519 AAAA… comment'): "
                                                 "ed25519, ECDSA or RSA of 2,048 bits or more. Never the private "
                                                 "key.")


class SshKeyListApi(APIView):
    write_action = "self"  # one's own credential (not by a read-only or project-limited token, not while suspended)

    @extend_schema(responses=paginated(SshKeyOutput), parameters=PAGE_PARAMETERS, operation_id="v1_ssh_keys_list",
                   summary="Your SSH public keys (for ssh to your leases)")
    def get(self, request):
        return paginate(self, request, ssh_keys.ssh_key_list(actor=request.actor), SshKeyOutput)

    @extend_schema(request=SshKeyCreateInput,
                   responses={201: SshKeyOutput, 409: problem("The key is registered already, or you have 20")},
                   summary="Add an SSH public key")
    def post(self, request):
        data = parse(SshKeyCreateInput, request)
        key = ssh_keys.ssh_key_add(actor=request.actor, name=data["name"], public_key=data["public_key"])
        return Response(SshKeyOutput(key).data, status=status.HTTP_201_CREATED)


class SshKeyDetailApi(APIView):
    write_action = "leave"  # removing one's own credential: allowed while suspended

    @extend_schema(responses=SshKeyOutput, summary="One of your SSH keys")
    def get(self, request, pk: int):
        return Response(SshKeyOutput(ssh_keys.ssh_key_get(actor=request.actor, pk=pk)).data)

    @extend_schema(responses={204: None}, summary="Remove one of your SSH keys (its sessions already open go on)")
    def delete(self, request, pk: int):
        ssh_keys.ssh_key_remove(actor=request.actor, key=ssh_keys.ssh_key_get(actor=request.actor, pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
