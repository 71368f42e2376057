"""Slugs: the ASCII names that teams and endpoints carry in URLs, made from the names people
give them. A Chinese name becomes its pinyin (pypinyin), so 风控团队 is ``feng-kong-tuan-dui``
and not an anonymous ``team-2``."""

from django.utils.text import slugify


def ascii_slug(name: str) -> str:
    """``name`` as lower-case ASCII words joined by hyphens; empty when nothing of it can be
    written so (symbols only)."""
    from pypinyin import lazy_pinyin  # its dictionaries load on first use

    return slugify(" ".join(lazy_pinyin(name)))
