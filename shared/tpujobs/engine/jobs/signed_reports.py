"""Reports and notices from a job's hosts, decoded and believed only when signed for their attempt."""

from __future__ import annotations

from typing import Protocol

from tpujobs.domain import signing
from tpujobs.domain.job import Job
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.rejections import ForgeryCounts, Rejections
from tpujobs.engine.messages import Report, ReportError, decode_report
from tpujobs.engine.ports import Clock, JobRecords, MessageRecords
from tpujobs.engine.worker_reports import SignedReport


class _ReportStore(JobRecords, MessageRecords, Protocol):
    """The job, to check a report against, and the digests of the reports seen."""


NOT_A_REPORT = "it is not a well-formed report"


class SignedReports:
    """Decodes a host's message and checks its signature, then its job, host, time and novelty.

    A message that does not prove itself signed (undecodable, unsigned, forged) is refused before
    any read, and counted rather than written (`ForgeryCounts`): a flood of them costs nothing but
    the function's time."""

    def __init__(self, store: _ReportStore, keys: signing.MasterKeys, clock: Clock, rejections: Rejections) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self.rejections = rejections
        self.forgeries = ForgeryCounts(rejections)

    def decode(self, model: type[Report], message: InboundMessage, *, signed: bool = True) -> Report | None:
        """The message as `model`; None when it is not one: counted, when it should be a host's
        signed message (anyone's VM may publish those), else recorded with the reason."""
        try:
            return decode_report(model, message.data)
        except ReportError as error:
            if signed:
                self.forgeries.count(message, NOT_A_REPORT, message.undecodable or str(error))
            else:
                self.rejections.reject(message, message.undecodable or str(error))
            return None

    def believed(self, report: SignedReport, message: InboundMessage) -> Job | None:
        """The job, as read to check it, when a report or notice is what the hosts of the
        attempt it names said; else None.

        Signed with that attempt's key (checked first, from the message alone), for this job
        (not an earlier one of the same id), from a host the job has, timed within the attempt,
        and not a replay (the same signed bytes under another message id; a redelivery keeps
        its id). Otherwise it changes nothing and is refused.
        """
        forged = signing.forgery(self.keys, report.job_id, report.attempt, message.data or b"", message.attributes)
        if forged is not None:
            said = f"Report for {report.job_id} attempt {report.attempt} refused unread: it is {forged}."
            self.forgeries.count(message, forged, said)
            return None
        self.forgeries.flush_due()
        job = self.store.get(report.job_id)
        if job is None:
            self.rejections.reject(message, f"job_id {report.job_id!r}: no such job")
            return None
        now = self.clock()
        problem = signing.report_problem(
            job,
            attempt=report.attempt,
            slice_id=report.slice_id,
            worker_id=report.worker_id,
            at=report.at,
            created=message.attributes.get(signing.JOB_CREATED_ATTRIBUTE, ""),
            now=now,
        )
        if problem is None:
            signature = message.attributes[signing.SIGNATURE_ATTRIBUTE]
            first = self.store.remember_report(
                signing.report_digest(signature), message.message_id, report.job_id, report.attempt, now
            )
            if first != message.message_id:
                problem = f"it is a replay: the same signed report arrived before as message {first}"
        if problem is not None:
            self.rejections.reject(message, f"Report for {report.job_id} attempt {report.attempt} refused: {problem}.")
            return None
        return job
