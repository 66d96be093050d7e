"""A job's secret values are cut out of its output on the host, in every form a program prints."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable

import pytest

from tpujobs.agent.last_output import LastOutput, last_lines
from tpujobs.agent.masking import SecretMask, forms
from tpujobs.agent.output import Tee

VALUE = 'hf_Zq9"/+ &é\\x'  # quotes, slashes, a space, an ampersand, a backslash, a non-ASCII letter
SECRETS = {"HF_TOKEN": VALUE}
TAG = b"[secret HF_TOKEN]"

FORMS: dict[str, Callable[[str], bytes]] = {
    "raw": lambda v: v.encode(),
    "base64": lambda v: base64.b64encode(v.encode()),
    "base64 unpadded": lambda v: base64.b64encode(v.encode()).rstrip(b"="),
    "base64 url-safe": lambda v: base64.urlsafe_b64encode(v.encode()),
    "base64 url-safe unpadded": lambda v: base64.urlsafe_b64encode(v.encode()).rstrip(b"="),
    "json-escaped": lambda v: json.dumps(v)[1:-1].encode(),
    "json-escaped unicode": lambda v: json.dumps(v, ensure_ascii=False)[1:-1].encode(),
    "url-encoded": lambda v: urllib.parse.quote(v, safe="").encode(),
    "url-encoded form": lambda v: urllib.parse.quote_plus(v, safe="").encode(),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_is_masked_wherever_the_stream_is_cut(form: str) -> None:
    """The form split between two reads at every byte is still recognised, and nothing else changes."""
    printed = FORMS[form](VALUE)
    assert printed in forms(VALUE)
    stream = b"before " + printed + b" after\n"
    for cut in range(1, len(stream)):
        mask = SecretMask(SECRETS)
        out = mask.feed(stream[:cut]) + mask.feed(stream[cut:]) + mask.flush()
        assert out == b"before " + TAG + b" after\n", (form, cut, out)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_is_cut_out_of_the_last_lines(form: str) -> None:
    """The lines a failed `exited` carries (and so its retry_line) hold no form of the value."""
    lines = last_lines(b"token: " + FORMS[form](VALUE) + b"\n", SECRETS)
    assert lines == ["token: [secret HF_TOKEN]"]


class Shipper:
    def __init__(self) -> None:
        self.shipped = b""

    def write(self, data: bytes, stream: str = "agent") -> bytes:
        self.shipped += data
        return b""


def test_the_tee_ships_and_keeps_only_masked_output() -> None:
    """What goes to the chunks and to the last output is masked; the held-back tail comes at the end."""
    shipper, last = Shipper(), LastOutput()
    tee = Tee(shipper, last, SECRETS)  # type: ignore[arg-type]
    printed = b"".join(FORMS[form](VALUE) + b"\n" for form in sorted(FORMS))
    for start in range(0, len(printed), 5):
        tee.write(printed[start : start + 5])
    tee.flush()
    assert shipper.shipped == (TAG + b"\n") * len(FORMS)
    assert last.snapshot() == shipper.shipped


def test_short_values_are_masked_raw_only() -> None:
    """A 3-byte value would hide ordinary words in its encodings: only its raw bytes count."""
    assert forms("abc") == {b"abc"}
    assert SecretMask({"PIN": "abc"}).mask(b"YWJj abc") == b"YWJj [secret PIN]"
