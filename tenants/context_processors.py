from tenants.selectors import membership_list_for_user


def current_tenant(request):
    actor = getattr(request, "actor", None)
    if actor is None or not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {
        "actor": actor if actor else None,
        "memberships": membership_list_for_user(user=request.user),
    }
