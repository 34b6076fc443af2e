"""SIP header fields (RFC 3261 7.3): names in their canonical and compact forms, and the ordered,
case-insensitive, multi-valued collection a message carries."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from parley.transports.sip.uri import SipError, is_token, show, split_outside

# RFC 3261 7.3.3 plus the compact forms registered since (RFC 3265, 3515, 3892, 4028, 3841, 8224).
_COMPACT = {
    "i": "call-id", "m": "contact", "e": "content-encoding", "l": "content-length", "c": "content-type",
    "f": "from", "s": "subject", "k": "supported", "t": "to", "v": "via", "o": "event", "r": "refer-to",
    "b": "referred-by", "x": "session-expires", "u": "allow-events", "a": "accept-contact",
    "j": "reject-contact", "d": "request-disposition", "y": "identity",
}  # fmt: skip
_CANONICAL = {
    "call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate", "rack": "RAck",
    "rseq": "RSeq", "sip-etag": "SIP-ETag", "sip-if-match": "SIP-If-Match", "mime-version": "MIME-Version",
    "content-id": "Content-ID",
}  # fmt: skip
# Headers whose grammar is a comma-separated list (RFC 3261 7.3.1); the auth headers are not, their
# parameters are separated by commas too.
_LIST_HEADERS = frozenset({
    "via", "contact", "route", "record-route", "allow", "supported", "require", "proxy-require",
    "unsupported", "allow-events", "path", "service-route", "accept", "accept-encoding", "accept-language",
    "content-encoding",
})  # fmt: skip


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = _COMPACT.get(key, key)
    if not is_token(key):
        raise SipError(f"bad header name {show(name)}")
    return _CANONICAL.get(key) or "-".join(part.capitalize() for part in key.split("-"))


class Headers:
    """Ordered, case-insensitive, multi-valued header fields; compact names are stored as long names."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items:
            self.add(name, value)

    @staticmethod
    def _value(value: str) -> str:
        if "\r" in value or "\n" in value or "\0" in value:
            raise SipError(f"header value with CR, LF or NUL: {show(value)}")
        return value.strip()

    def add(self, name: str, value: str) -> None:
        self._items.append((canonical_name(name), self._value(value)))

    def set(self, name: str, value: str) -> None:
        """Replaces every value of `name` by `value`, at the place of the first one."""
        name, value = canonical_name(name), self._value(value)
        at = next((i for i, (n, _) in enumerate(self._items) if n == name), len(self._items))
        self.remove(name)
        self._items.insert(at, (name, value))

    def replace_first(self, name: str, value: str) -> None:
        name, value = canonical_name(name), self._value(value)
        for i, (n, _) in enumerate(self._items):
            if n == name:
                self._items[i] = (name, value)
                return
        self._items.append((name, value))

    def remove(self, name: str) -> None:
        name = canonical_name(name)
        self._items = [(n, v) for n, v in self._items if n != name]

    def get(self, name: str) -> str | None:
        name = canonical_name(name)
        return next((v for n, v in self._items if n == name), None)

    def get_all(self, name: str) -> list[str]:
        """Every value, with comma-separated lists split for the headers whose grammar is a list."""
        name = canonical_name(name)
        values = [v for n, v in self._items if n == name]
        if name.lower() not in _LIST_HEADERS:
            return values
        return [item.strip() for v in values for item in split_outside(v, ",") if item.strip()]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            name = canonical_name(name)
        except SipError:
            return False
        return any(n == name for n, _ in self._items)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"

    def copy(self) -> Headers:
        new = Headers()
        new._items = list(self._items)
        return new
