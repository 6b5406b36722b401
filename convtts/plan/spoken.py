"""Links, e-mail addresses, file paths, IP addresses and inline code said as words, never dropped.

A voice cannot say `https://nodejs.org/en/download`; deleting it leaves a hole ("See and for
Node.js."). Each rule here puts a short spoken form in its place: the site's domain ("nodejs dot
org") or a fixed phrase for links, the address for e-mail, the file name for a path.
"""

from __future__ import annotations

import re

# 'https://www.example.com/a?b=1', 'www.example.org', '<https://nodejs.org>' (an autolink). A trailing
# full stop, comma or closing mark belongs to the sentence; a bracket pair inside belongs to the link.
_URL = re.compile(
    r"<?(?:\b(?:https?|ftp)://|\bwww\.)(?:[^\s<>\"'()\[\]`*]|\([^\s()]*\))*"
    r"(?:[^\s<>\"'()\[\]`*.,;:!?]|\([^\s()]*\))>?"
)
# 'nodejs.org', 'docs.python.org/3/' without a scheme: only under these common endings, so that
# 'Node.js', 'README.md' or 'e.g.' stay words.
_BARE_DOMAIN = re.compile(
    r"(?<![\w@./-])(?:[A-Za-z0-9-]+\.)+(?:com|org|net|io|dev|edu|gov|app|info|co\.uk|de|fr|eu|ca|au|jp|nl|ch)"
    r"(?:/[^\s<>\"'()\[\]`*]*[^\s<>\"'()\[\]`*.,;:!?])?(?![\w@-])"
)
_HOST = re.compile(r"^(?:[a-z]+://)?(?:[^@/\s]*@)?(\[[^\]]*\]|[^/:?#\s]+)", re.I)
_EMAIL = re.compile(r"(?:mailto:)?\b([\w.+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)\b")
# 192.168.0.1, 10.0.0.0/8, 127.0.0.1:8080
_IPV4 = re.compile(
    r"(?<![\w.])((?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"
    r"(?:/(\d{1,2}))?(?::(\d{1,5}))?(?!\w|\.\d)"
)
# ::1, fe80::1, 2001:db8:0:0:0:0:0:1 (eight groups, or fewer around one '::'); not 'std::vector' or '10:30'
_HEX = r"[0-9A-Fa-f]{1,4}"
_IPV6 = re.compile(
    rf"(?<![\w:])(?:{_HEX}(?::{_HEX}){{7}}|(?:{_HEX}(?::{_HEX})*)?::{_HEX}(?::{_HEX})*|{_HEX}(?::{_HEX})*::)"
    r"(?:/(\d{1,3}))?(?![\w:])"
)
# /etc/nginx/nginx.conf, ~/.bashrc, ./run.sh, ../lib/, src/main.py, C:\Users\me\notes.txt; not 'and/or' or '24/7'
_PATH = re.compile(
    r"(?<![\w/.:~\\])(?:(?:~|\.\.?)?/(?:[\w.@+-]+/)*[\w.@+-]*[\w+-]/?"
    r"|(?:[\w.-]+/)+[\w-]+\.[A-Za-z][\w]{0,5}(?![\w/])"
    r"|[A-Za-z]:\\(?:[^\\\s]+\\)*[^\\\s]*)"
)
# Short inline code a voice can read as it stands: 'pip install', 'x = 1', 'Node.js', 'print()'.
_SAYABLE_CODE = re.compile(r"[\w.+#%/= -]{1,40}(?:\(\))?")
INLINE_CODE = re.compile(r"(`+)([^`\n]+?)\1")
# Second-level labels under a country's ending that belong to the registrable domain: example.co.uk.
_SECOND_LEVEL = frozenset("ac co com edu gov ne net or org".split())

CODE_WORDS = "this code"  # what an inline snippet too dense to read aloud becomes


def speak_links(text: str, link_phrase: str | None = None) -> str:
    """Every link becomes its domain spoken ('nodejs dot org'), or link_phrase when one is given."""
    if "://" in text or "www." in text:
        text = _URL.sub(lambda m: _say_link(m.group(), link_phrase), text)
    if "." in text:
        text = _BARE_DOMAIN.sub(lambda m: _say_link(m.group(), link_phrase), text)
    return text


def _say_link(url: str, link_phrase: str | None) -> str:
    if link_phrase is not None:
        return link_phrase
    host = _HOST.match(url.strip("<>")).group(1).lower().strip("[]")
    if _IPV4.fullmatch(host) or _IPV6.fullmatch(host):
        return speak_addresses(host)
    return " dot ".join(registrable_domain(host).split("."))


def registrable_domain(host: str) -> str:
    """'en.wikipedia.org' -> 'wikipedia.org', 'www.bbc.co.uk' -> 'bbc.co.uk', 'localhost' -> 'localhost'."""
    labels = [label for label in host.split(".") if label]
    keep = 3 if len(labels) >= 3 and len(labels[-1]) == 2 and labels[-2] in _SECOND_LEVEL else 2
    return ".".join(labels[-keep:])


def strip_links(text: str) -> str:
    """The text without its links and e-mail addresses: what is left to say besides them."""
    return _BARE_DOMAIN.sub("", _URL.sub("", _EMAIL.sub("", text)))


def speak_email(text: str) -> str:
    """'jane.doe+news@example.co.uk' -> 'jane dot doe plus news at example dot co dot uk'."""
    return _EMAIL.sub(lambda m: f"{_say_name(m.group(1))} at {' dot '.join(m.group(2).split('.'))}", text)


def _say_name(local: str) -> str:
    for mark, word in ((".", " dot "), ("+", " plus "), ("_", " underscore ")):
        local = local.replace(mark, word)
    return local


def speak_addresses(text: str) -> str:
    """IPv4 and IPv6 literals digit group by group: '127.0.0.1:8080' -> '127 dot 0 dot 0 dot 1 port 8080'."""
    if "." in text:
        text = _IPV4.sub(_say_ipv4, text)
    if "::" in text or text.count(":") >= 7:
        text = _IPV6.sub(_say_ipv6, text)
    return text


def _say_ipv4(match: re.Match) -> str:
    words = " dot ".join(match.group(1).split("."))
    if match.group(2):
        words += f" slash {match.group(2)}"
    if match.group(3):
        words += f" port {match.group(3)}"
    return words


def _say_ipv6(match: re.Match) -> str:
    address, _, prefix = match.group().partition("/")
    spoken = " ".join(address.replace("::", " double colon ").replace(":", " colon ").split())
    return spoken + (f" slash {prefix}" if prefix else "")


def speak_paths(text: str) -> str:
    """A file path becomes its last part: '/etc/nginx/nginx.conf' -> 'nginx dot conf', '~/.bashrc' -> 'dot bashrc'."""
    return _PATH.sub(_say_path, text)


def _say_path(match: re.Match) -> str:
    parts = [part for part in re.split(r"[/\\]", match.group()) if part not in ("", ".", "..", "~")]
    if not parts:
        return match.group()
    name = parts[-1]
    stem, dot, extension = name.rpartition(".")
    said = f"{stem} dot {extension}" if dot and extension else name
    return " ".join(said.replace("_", " ").replace("-", " ").split())


def speak_inline_code(text: str, unreadable: str = CODE_WORDS) -> str:
    """`pip install` keeps its words, `print()` its name, `np.array` is 'np dot array'; a dense
    snippet (`ls -la | grep x`) becomes unreadable ('this code')."""
    return INLINE_CODE.sub(lambda m: _say_code(m.group(2).strip(), unreadable), text)


def _say_code(code: str, unreadable: str) -> str:
    if not _SAYABLE_CODE.fullmatch(code):
        return unreadable
    code = code.removesuffix("()")
    return _CODE_DOT.sub(" dot ", code) if "." in code else code


_CODE_DOT = re.compile(r"(?<=[A-Za-z_])\.(?=[A-Za-z_])")  # 'np.array', 'os.path.join'; not '3.5' or 'v1.2'
