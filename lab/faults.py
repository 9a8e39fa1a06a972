"""Every fault knob of the lab's services, read and reset in one place: the simulated hardware
(per-step knobs), the ERP receiver (a queue of faults for the next notices) and the image server
(a fault for the next image response). Tests set knobs to make one run misbehave; a knob still
set afterwards would make the next run misbehave too, so a test's teardown asks `knobs_set` and
`reset_all`."""

from __future__ import annotations

from typing import Any

import requests

from lab.state import LabInfo

TIMEOUT = 5.0


def _endpoints(info: LabInfo) -> dict[str, str]:
    """Each service's fault endpoint (GET shows the knobs, DELETE clears them all)."""
    return {"simulator": f"{info.simulator_url}/faults",
            "erp-receiver": f"{info.erp_url}/_lab/faults",
            "image-server": f"{info.image_server_url}/_lab/faults"}


def _active(service: str, body: Any) -> Any:
    """The knobs in a service's answer that would still act (a spent one does nothing)."""
    if service == "simulator":  # {step: {"delay", "fail", "never"}}; `fail` counts down to 0
        return {step: knob for step, knob in body.items()
                if knob.get("delay") or knob.get("fail") or knob.get("never")}
    return body["faults"]  # the ERP's queue (entries leave when used up), the image server's dict


def knobs_set(info: LabInfo) -> dict[str, Any]:
    """{service: its knobs that would still act}, only for services with some."""
    found = {}
    for service, url in _endpoints(info).items():
        response = requests.get(url, timeout=TIMEOUT)
        response.raise_for_status()
        active = _active(service, response.json())
        if active:
            found[service] = active
    from lab.wan import cut_links

    if cut := cut_links(info):  # a store's WAN link cut on command is a knob too
        found["store-links"] = {"cut": cut}
    return found


def set_fault(info: LabInfo, target: str, knob: dict[str, Any]) -> None:
    """Set one knob: `target` "erp" (queued), "image" (the next image response) or a simulator
    step ("pxe", "reboot", ...)."""
    urls = _endpoints(info)
    url = {"erp": urls["erp-receiver"], "image": urls["image-server"]}.get(
        target, f"{urls['simulator']}/{target}")
    requests.post(url, json=knob, timeout=TIMEOUT).raise_for_status()


def clear_fault(info: LabInfo, step: str) -> None:
    """Clear one simulator knob (`step`, or `<step>@<machine>`) and its count; the others stay."""
    requests.delete(f"{_endpoints(info)['simulator']}/{step}", timeout=TIMEOUT).raise_for_status()


def reset_all(info: LabInfo) -> None:
    """Clear every knob of every service; a service that refuses raises (HTTPError names it)."""
    for url in _endpoints(info).values():
        requests.delete(url, timeout=TIMEOUT).raise_for_status()
    from lab.wan import cut_links, restore_store_link

    for store_id in cut_links(info):
        restore_store_link(info, store_id)
