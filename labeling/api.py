"""REST API of datasets, under /api/v1/teams/<team>/. Thin: services write, selectors read."""

import re
from dataclasses import asdict

from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import Op, TeamAPIView, created, service_call, validated
from console.pagination import PaginatedList
from console.roles import Perm
from labeling import exports, selectors
from labeling.datasets import (
    UploadOffsetMismatch,
    dataset_create,
    dataset_delete,
    upload_create,
    upload_write_chunk,
)
from labeling.imports import import_start, version_merge
from labeling.projects import (
    labeling_project_create,
    labeling_project_preannotate,
    labeling_project_set_labels,
)
from labeling.serializers import (
    DatasetCreateSerializer,
    DatasetSerializer,
    ExportRequestSerializer,
    ImportJobSerializer,
    ImportRequestSerializer,
    LabelingProjectCreateSerializer,
    LabelingProjectSerializer,
    LabelsRequestSerializer,
    MergeRequestSerializer,
    PredictionsRequestSerializer,
    UploadSerializer,
    VersionSerializer,
)
from labeling.sync import labeling_project_sync_request

CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class DatasetAPIView(TeamAPIView):
    write_permission = Perm.DATASET_WRITE

    def dataset(self):
        return selectors.dataset_get(self.request.team, self.kwargs["dataset_id"])

    def version(self):
        return selectors.version_get(self.dataset(), self.kwargs["number"])


class DatasetListCreate(PaginatedList, DatasetAPIView):
    get = Op.list(selectors.team_datasets_overview, DatasetSerializer)
    post = Op.create(dataset_create, body=DatasetCreateSerializer, answer=DatasetSerializer)


class DatasetDetail(DatasetAPIView):
    get = Op.retrieve(selectors.dataset_get, DatasetSerializer)
    delete = Op.delete(dataset_delete, dataset=selectors.dataset_get)


class UploadCreate(DatasetAPIView):
    post = Op.create(
        upload_create,
        body=UploadSerializer,
        answer=UploadSerializer,
        doc="Start a chunked upload: declare the file's name and size, then PUT its bytes.",
    )


class UploadDetail(DatasetAPIView):
    get = Op.retrieve(
        selectors.upload_get,
        UploadSerializer,
        doc="Where an upload stands: a client resumes from ``received``.",
    )

    @extend_schema(
        request={"application/octet-stream": bytes},
        responses={200: UploadSerializer, 409: UploadSerializer},
        parameters=[
            OpenApiParameter(
                "Content-Range", str, OpenApiParameter.HEADER, description="bytes START-END/TOTAL"
            )
        ],
    )
    def put(self, request: Request, team: str, upload_id) -> Response:
        """Send bytes START to END (inclusive). A chunk that does not start at ``received``
        is refused with 409 and the offset to resume from."""
        upload = selectors.upload_get(request.team, upload_id)
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        header = request.headers.get("Content-Range", "")
        if header:
            match = CONTENT_RANGE.fullmatch(header.strip())
            if not match:
                raise ValidationError({"detail": "Content-Range must be bytes START-END/TOTAL."})
            start, end, total = (int(g) for g in match.groups())
            if total != upload.size or end - start + 1 != length:
                raise ValidationError({"detail": "Content-Range does not match the upload."})
        else:
            start = 0
        try:
            upload = service_call(
                upload_write_chunk,
                upload=upload,
                offset=start,
                stream=request.stream,
                length=length,
            )
        except UploadOffsetMismatch:
            upload.refresh_from_db()
            return Response(UploadSerializer(upload).data, status=status.HTTP_409_CONFLICT)
        return Response(UploadSerializer(upload).data)


class UploadPreview(DatasetAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("dataset", int, required=True),
            OpenApiParameter("format", str),
            OpenApiParameter("encoding", str),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, team: str, upload_id) -> Response:
        """Detected format and encoding, the columns, the first rows and a proposed mapping."""
        upload = selectors.upload_get(request.team, upload_id)
        if upload.status != upload.Status.COMPLETE:
            raise ValidationError({"detail": "The upload is not complete."})
        dataset = selectors.dataset_get(request.team, request.query_params.get("dataset") or 0)
        preview = selectors.upload_preview(
            upload,
            dataset.task_kind,
            request.query_params.get("format"),
            request.query_params.get("encoding"),
        )
        return Response(asdict(preview))


class ImportCreate(DatasetAPIView):
    @extend_schema(request=ImportRequestSerializer, responses={202: ImportJobSerializer})
    def post(self, request: Request, team: str, dataset_id: int) -> Response:
        """Import a complete upload into a new version (queued; poll the import)."""
        dataset = self.dataset()
        data = validated(ImportRequestSerializer, request)
        upload = selectors.upload_get(request.team, data["upload"])
        if "format" not in data or "mapping" not in data or "encoding" not in data:
            preview = selectors.upload_preview(
                upload, dataset.task_kind, data.get("format"), data.get("encoding")
            )
            data.setdefault("format", preview.format)
            data.setdefault("encoding", preview.encoding)
            data.setdefault("mapping", preview.mapping)
        options = {
            k: data[k]
            for k in (
                "mapping",
                "fullwidth_to_halfwidth",
                "drop_duplicates",
                "strict",
                "ratios",
                "seed",
            )
        }
        job = service_call(
            import_start,
            actor=request.user,
            dataset=dataset,
            upload=upload,
            fmt=data["format"],
            encoding=data.get("encoding"),
            options=options,
        )
        return Response(ImportJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class ImportDetail(DatasetAPIView):
    get = Op.retrieve(selectors.import_job_get, ImportJobSerializer)


class Merge(DatasetAPIView):
    @extend_schema(request=MergeRequestSerializer, responses={202: ImportJobSerializer})
    def post(self, request: Request, team: str, dataset_id: int) -> Response:
        dataset = self.dataset()
        data = validated(MergeRequestSerializer, request)
        versions = selectors.versions_get(dataset, data.pop("versions"))
        job = service_call(
            version_merge,
            actor=request.user,
            dataset=dataset,
            versions=versions,
            options=data,
        )
        return Response(ImportJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class Compare(DatasetAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("a", int, required=True),
            OpenApiParameter("b", int, required=True),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, team: str, dataset_id: int) -> Response:
        dataset = self.dataset()
        try:
            a, b = int(request.query_params["a"]), int(request.query_params["b"])
        except (KeyError, ValueError) as exc:
            raise ValidationError({"detail": "a and b are version numbers."}) from exc
        diff = selectors.version_compare(
            selectors.version_get(dataset, a), selectors.version_get(dataset, b)
        )
        return Response(asdict(diff))


class VersionList(PaginatedList, DatasetAPIView):
    @extend_schema(responses=VersionSerializer(many=True))
    def get(self, request: Request, team: str, dataset_id: int) -> Response:
        versions = self.dataset().versions.select_related("parent", "created_by")
        return self.paginated(request, versions, VersionSerializer)


class VersionDetail(DatasetAPIView):
    def parent(self):
        return self.dataset()

    get = Op.retrieve(selectors.version_get, VersionSerializer)


def _page(request: Request) -> int:
    try:
        return max(int(request.query_params.get("page", 1)), 1)
    except ValueError as exc:
        raise ValidationError({"page": "a positive integer"}) from exc


class VersionRows(DatasetAPIView):
    @extend_schema(
        parameters=[OpenApiParameter(p, str) for p in ("q", "label", "split", "page")],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, team: str, dataset_id: int, number: int) -> Response:
        page = selectors.version_rows(
            self.version(),
            page=_page(request),
            **{k: request.query_params.get(k, "") for k in ("q", "label", "split")},
        )
        return Response(
            {
                "page": page.page,
                "has_next": page.has_next,
                "rows": [{"row": n, **row} for n, row in page.rows],
            }
        )


class VersionReport(DatasetAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("reason", str), OpenApiParameter("page", int)],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, team: str, dataset_id: int, number: int) -> Response:
        page = selectors.report_entries(
            self.version().report_file,
            page=_page(request),
            reason=request.query_params.get("reason", ""),
        )
        return Response(
            {
                "page": page.page,
                "has_next": page.has_next,
                "entries": [entry for _n, entry in page.rows],
            }
        )


class VersionDownload(DatasetAPIView):
    # The type is the file's: the original upload's, CSV, XLSX, JSON (report) or JSONL.
    @extend_schema(responses={(200, "*/*"): bytes})
    def get(self, request: Request, team: str, dataset_id: int, number: int, kind: str):
        """``original``, ``normalized`` (JSONL), ``report``, or the rows as ``csv`` or ``xlsx``
        (cells that a spreadsheet would run as formulas neutralised)."""
        return service_call(exports.download_response, version=self.version(), kind=kind)


class LabelingProjectAPIView(TeamAPIView):
    write_permission = Perm.LABELING_MANAGE

    def project(self):
        return selectors.labeling_project_get(self.request.team, self.kwargs["project_id"])


class LabelingProjectListCreate(PaginatedList, LabelingProjectAPIView):
    @extend_schema(responses=LabelingProjectSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        projects = selectors.team_labeling_projects(request.team)
        return self.paginated(request, projects, LabelingProjectSerializer)

    @extend_schema(
        request=LabelingProjectCreateSerializer, responses={201: LabelingProjectSerializer}
    )
    def post(self, request: Request, team: str) -> Response:
        """Create a labeling project from a version; Label Studio's side follows (queued)."""
        data = validated(LabelingProjectCreateSerializer, request)
        dataset = selectors.dataset_get(request.team, data.pop("dataset"))
        version = selectors.version_get(dataset, data.pop("version"))
        project = service_call(labeling_project_create, actor=request.user, version=version, **data)
        return created(LabelingProjectSerializer, project)


class LabelingProjectDetail(LabelingProjectAPIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, team: str, project_id: int) -> Response:
        """The project, its progress and (with overlap) its agreement."""
        project = self.project()
        return Response(
            {
                **LabelingProjectSerializer(project).data,
                "progress": selectors.labeling_project_progress(project),
                "agreement": selectors.labeling_project_agreement(project),
                # Annotations in Label Studio that do not count, and why.
                "rejected": selectors.labeling_project_rejected(project),
            }
        )

    patch = Op.update(
        labeling_project_set_labels,
        project=selectors.labeling_project_get,
        body=LabelsRequestSerializer,
        answer=LabelingProjectSerializer,
        doc="Change the label set (only before the first annotation).",
    )


class LabelingProjectSync(LabelingProjectAPIView):
    @extend_schema(request=None, responses={202: None})
    def post(self, request: Request, team: str, project_id: int) -> Response:
        labeling_project_sync_request(self.project())
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)


class LabelingProjectExport(LabelingProjectAPIView):
    post = Op.action(
        exports.labeling_project_export,
        project=selectors.labeling_project_get,
        body=ExportRequestSerializer,
        status_code=202,
        answer=ImportJobSerializer,
    )


class LabelingProjectPredictions(LabelingProjectAPIView):
    @extend_schema(request=PredictionsRequestSerializer, responses={201: None})
    def post(self, request: Request, team: str, project_id: int) -> Response:
        """Pre-annotations: a model's predictions with scores, served least confident first."""
        project = self.project()  # 404 before 400
        data = validated(PredictionsRequestSerializer, request)
        count = service_call(
            labeling_project_preannotate,
            project=project,
            **data,
        )
        return Response({"imported": count}, status=status.HTTP_201_CREATED)
