"""Who hears of a live finding, and sending it: apprise (e-mail, Slack, Teams, Matrix,
webhooks...), one message per finding and recipient."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from audit.errors import InputError, install_hint
from audit.watch.settings import NotifySettings, Policy


@dataclass(frozen=True)
class Recipient:
    label: str  # what is recorded and shown: an address, or a URL without its password
    url: str | None  # the apprise URL; None when the address cannot be reached (why: label)
    problem: str = ""


def recipients(
    settings: NotifySettings, policy: Policy, user: str | None, team: str | None
) -> list[Recipient]:
    """The job's user (``users`` map, else USER@``mail_domain``), its team (``teams``),
    the policy's own ``notify`` list and ``[watch.notify] urls``, each once."""
    wanted: list[str] = []
    if user:
        address = settings.users.get(user) or (
            f"{user}@{settings.mail_domain}" if settings.mail_domain else ""
        )
        if address:
            wanted.append(address)
    if team and settings.teams.get(team):
        wanted.append(settings.teams[team])
    wanted += [*policy.notify, *settings.urls]
    out, seen = [], set()
    for target in wanted:
        if target in seen:
            continue
        seen.add(target)
        out.append(recipient_for(target, settings))
    return out


def recipient_for(target: str, settings: NotifySettings) -> Recipient:
    if "://" in target:
        return Recipient(shown_url(target), target)
    if not settings.email_url:
        return Recipient(target, None, "no [watch.notify] email_url to send e-mail through")
    glue = "&" if "?" in settings.email_url else "?"
    return Recipient(target, f"{settings.email_url}{glue}to={quote(target, safe='@')}")


def shown_url(url: str) -> str:
    """An apprise URL as recorded: scheme, host and path; credentials and query left out."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


class Notifier:
    """Sends through apprise; made once per invocation (apprise is an optional extra)."""

    def __init__(self, settings: NotifySettings):
        try:
            import apprise
        except ImportError:
            raise InputError(f"notifications need apprise: {install_hint('watch')}") from None
        self.apprise = apprise
        # no state files under the home folder: nothing apprise keeps is needed here
        self.asset = apprise.AppriseAsset(storage_mode="memory")
        self.timeout = settings.timeout_seconds

    def send(self, recipient: Recipient, title: str, body: str) -> str | None:
        """None when sent, else why not (one line)."""
        if recipient.url is None:
            return recipient.problem
        sender = self.apprise.Apprise(asset=self.asset)
        if not sender.add(recipient.url):
            return f"not an apprise URL apprise can use: {recipient.label}"
        for server in sender:  # bounded: a mail server that stalls must not stall the watch
            server.socket_connect_timeout = self.timeout
            server.socket_read_timeout = self.timeout
        return (
            None
            if sender.notify(title=title, body=body)
            else f"sending to {recipient.label} failed"
        )
