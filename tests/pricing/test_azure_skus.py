"""Azure resource-SKU discovery with the real azure-mgmt-compute client against a local TLS fake.

azure-core refuses to send bearer tokens over plain HTTP, so the fake serves HTTPS with a
certificate from a throwaway trustme CA, and the client trusts that CA via ``connection_verify``.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import pytest
import trustme
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from costopt.domain import Cloud
from costopt.errors import SourceUnavailable
from pricing.azure import AzureResourceSkus
from tests.net_support import LoopbackServer, server_tls

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "azure"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
TOKEN = "fake-token"
REAL_ARM = "https://management.azure.com"


class FakeCredential:
    """A TokenCredential that hands out a fixed token (and counts the calls)."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        return AccessToken(self.token, int(time.time()) + 3600)


class RefusingCredential:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return doc


class FakeArm:
    """``GET /subscriptions/{id}/providers/Microsoft.Compute/skus`` over TLS on 127.0.0.1.

    Serves two fixture pages (the first one's ``nextLink`` rewritten to this server), keeps only the
    SKUs of the ``location eq '...'`` filter, answers 401 without the bearer token and 500 for
    locations in ``failing``.
    """

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        self.failing: set[str] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                fake.requests.append((parts.path, query, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"error": {"code": "AuthenticationFailed", "message": "no token"}})
                    return
                if parts.path != f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/skus":
                    self._send(404, {"error": {"code": "NotFound", "message": parts.path}})
                    return
                flt = query.get("$filter", [""])[0]
                location = flt.split("'")[1] if "'" in flt else None
                if location in fake.failing:
                    self._send(500, {"error": {"code": "InternalServerError", "message": "scripted"}})
                    return
                page = load(f"resource_skus_page{2 if '$skiptoken' in query else 1}.json")
                if page.get("nextLink"):  # this server, and the filter of this request
                    link = urlsplit(page["nextLink"].replace(REAL_ARM, fake.url))
                    params = {"api-version": query["api-version"][0], "$skiptoken": "page2"}
                    if flt:
                        params["$filter"] = flt
                    page["nextLink"] = link._replace(query=urlencode(params, quote_via=quote)).geturl()
                if location is not None:
                    page["value"] = [s for s in page["value"] if location in s["locations"]]
                self._send(200, page)

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = LoopbackServer(Handler, tls=tls)
        self.url = self.http.url

    def __enter__(self) -> FakeArm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()


@pytest.fixture
def arm(ca: trustme.CA) -> Iterator[FakeArm]:
    with FakeArm(server_tls(ca)) as server:
        yield server


def catalog(url: str, ca_file: str, credential: Any = None, **kw: Any) -> AzureResourceSkus:
    return AzureResourceSkus(
        SUBSCRIPTION,
        credential=credential if credential is not None else FakeCredential(),
        base_url=url,
        client_kwargs={"connection_verify": ca_file, "retry_total": 0, **kw},
    )


def test_gpu_sizes_of_a_region_become_instance_types_with_capabilities_from_the_api(arm, ca_file):
    found = catalog(arm.url, ca_file).discover(["eastus"])
    types = {t.name: t for t in found.instance_types}
    assert set(types) == {
        "Standard_NC6s_v3",
        "Standard_NC4as_T4_v3",
        "Standard_NV6ads_A10_v5",
        "Standard_ND96isr_H100_v5",
    }
    nc6 = types["Standard_NC6s_v3"]
    assert (nc6.cloud, nc6.accelerator, nc6.gpu_count, nc6.vcpus, nc6.memory_gib) == (Cloud.AZURE, "v100", 1, 6, 112)
    assert nc6.source == "azure-skus"
    assert types["Standard_ND96isr_H100_v5"].gpu_count == 8
    assert not found.partial


def test_non_gpu_sizes_and_other_resource_types_are_ignored(arm, ca_file):
    found = catalog(arm.url, ca_file).discover(["eastus"])
    names = {t.name for t in found.instance_types}
    assert "Standard_D2s_v3" not in names
    assert "Aligned" not in names


def test_gpu_sizes_missing_from_the_size_table_are_listed_as_unknown(arm, ca_file):
    found = catalog(arm.url, ca_file).discover(["eastus"])
    assert found.unknown == ["Standard_NV16as_v4"]


def test_partitioned_gpu_sizes_keep_the_fraction_of_the_size_table(arm, ca_file):
    found = catalog(arm.url, ca_file).discover(["eastus"])
    a10 = next(t for t in found.instance_types if t.name == "Standard_NV6ads_A10_v5")
    assert a10.accelerator == "a10"
    assert a10.gpu_count == pytest.approx(1 / 6)


def test_sizes_restricted_for_the_subscription_are_not_listed_as_available(arm, ca_file):
    found = catalog(arm.url, ca_file).discover(["eastus"])
    assert found.available == {
        "eastus": ["Standard_NC6s_v3", "Standard_ND96isr_H100_v5", "Standard_NV6ads_A10_v5"],
    }


def test_the_client_sends_the_bearer_token_the_location_filter_and_follows_next_link(arm, ca_file):
    cred = FakeCredential()
    catalog(arm.url, ca_file, credential=cred).discover(["eastus"])
    assert len(arm.requests) == 2
    (path1, q1, auth1), (_, q2, auth2) = arm.requests
    assert path1 == f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/skus"
    assert q1["$filter"] == ["location eq 'eastus'"]
    assert "api-version" in q1
    assert q2["$skiptoken"] == ["page2"]
    assert auth1 == auth2 == f"Bearer {TOKEN}"
    assert cred.calls >= 1


def test_without_regions_one_unfiltered_listing_covers_every_location(arm, ca_file):
    found = catalog(arm.url, ca_file).discover()
    assert "$filter" not in arm.requests[0][1]
    assert found.available["eastus2"] == ["Standard_NC6s_v3"]
    assert sum(t.name == "Standard_NC6s_v3" for t in found.instance_types) == 1


def test_a_failing_region_among_others_makes_the_discovery_partial(arm, ca_file):
    arm.failing.add("westus9")
    found = catalog(arm.url, ca_file).discover(["westus9", "eastus"])
    assert found.partial
    assert "westus9" in found.errors[0]
    assert found.available.keys() == {"eastus"}


def test_all_regions_failing_raises_source_unavailable(arm, ca_file):
    arm.failing.add("westus9")
    with pytest.raises(SourceUnavailable, match="could not list Azure resource SKUs"):
        catalog(arm.url, ca_file).discover(["westus9"])


def test_refused_credentials_raise_source_unavailable_saying_how_to_sign_in(arm, ca_file):
    with pytest.raises(SourceUnavailable, match="az login"):
        catalog(arm.url, ca_file, credential=RefusingCredential()).discover(["eastus"])
    assert arm.requests == []


def test_an_untrusted_certificate_is_refused(arm):
    with pytest.raises(SourceUnavailable, match=r"SSL|certificate"):
        AzureResourceSkus(
            SUBSCRIPTION, credential=FakeCredential(), base_url=arm.url, client_kwargs={"retry_total": 0}
        ).discover(["eastus"])


def test_bearer_tokens_are_never_sent_over_plain_http(ca_file):
    with FakeArm(None) as plain:
        with pytest.raises(SourceUnavailable, match="non-TLS"):
            catalog(plain.url, ca_file).discover(["eastus"])
        assert plain.requests == []


def test_a_subscription_id_is_required():
    with pytest.raises(ValueError, match="subscription"):
        AzureResourceSkus("")
