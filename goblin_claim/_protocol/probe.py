"""The native probe: one ``COMMAND INFO`` that tells which native commands and owner checks a server has."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .scripts import PROBED_COMMANDS, with_owner_checks

# Sent as one word so redis-py skips its COMMAND reply parser, which cannot read
# the nil entries that COMMAND INFO returns for commands the server lacks.
PROBE_COMMAND = "COMMAND INFO"
# The module's commands and the server's built-in owner checks, in one ask.
PROBE_ARGS = tuple(name.lower() for name in PROBED_COMMANDS)


def native_from_probe(reply: object) -> frozenset[str]:
    """The native commands and built-in owner checks a ``COMMAND INFO`` reply lists.

    ``SET IFEQ`` is added where DELIFEQ or DELEX shows it (see ``_protocol.scripts.SET_IFEQ``).
    An error reply (NOPERM when the ACL lacks ``+command``, for one) means
    "no native commands", not a failure: the scripts always work.
    """
    if not isinstance(reply, list):
        return frozenset()
    return with_owner_checks(frozenset(name for name, entry in zip(PROBED_COMMANDS, reply, strict=False) if entry))


def native_from_command_table(table: Mapping[str, object] | Iterable[str]) -> frozenset[str]:
    """The native commands and owner checks in a cluster client's command table (lower-case names)."""
    return with_owner_checks(frozenset(name for name in PROBED_COMMANDS if name.lower() in table))
