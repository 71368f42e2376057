from django import template

register = template.Library()


@register.filter
def field(row: dict, name: str) -> str:
    """A row's field for display: lists joined, entities as text[start:end]/label."""
    value = row.get(name)
    if name == "entities" and isinstance(value, list):
        text = row.get("text", "")
        return "  ".join(f"{text[e['start'] : e['end']]}/{e['label']}" for e in value)
    if name == "messages" and isinstance(value, list):
        return "  ⏎  ".join(f"{t['role']}: {t['content']}" for t in value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


@register.filter
def split_label(split: str) -> str:
    """A split's name as pages show it (training set…); an unknown one as it is."""
    from labeling.pipeline import SPLIT_LABELS

    return str(SPLIT_LABELS.get(split, split))
