from django import template

register = template.Library()


@register.filter
def gpus(milli: int) -> str:
    """Milli-GPU as GPUs for people: 4000 → "4", 2500 → "2.5", 3000/7 ≈ 429 → "0.43"."""
    if milli is None:
        return "\u2013"  # en dash
    value = milli / 1000
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text
