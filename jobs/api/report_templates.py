"""A client's report templates (docs/api.md, "Report templates"): POST and GET /v1/report-templates, one version
as written, and the `live` label. Thin views over jobs.kinds.report.templates; a client sees and names only its
own templates (another's name is the same 404 as no name at all)."""

import re

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.parsers import read_json_body
from jobs.api.schema import ERROR_SCHEMA
from jobs.api.serializers import StrictCharField, StrictIntegerField, StrictRegexField, StrictSerializer
from jobs.kinds.report import templates
from jobs.kinds.report.kind import CHAPTER_KEY
from jobs.models import ReportTemplate

# A template's name; an order's `product` of the same name is written from it (orders.views).
NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
NAME = re.compile(rf"\A{NAME_PATTERN}\Z", re.ASCII)
_TITLE_MAX_CHARS = 500


def _text(**kwargs):
    return StrictCharField(max_length=templates.FIELD_MAX_CHARS, trim_whitespace=False, **kwargs)


class ChapterSerializer(StrictSerializer):
    key = StrictRegexField(CHAPTER_KEY.pattern, max_length=64)  # a report input's chapter key
    title = StrictCharField(max_length=_TITLE_MAX_CHARS, trim_whitespace=False)
    instruction = _text()


class LayoutSerializer(StrictSerializer):
    title = StrictCharField(max_length=_TITLE_MAX_CHARS, trim_whitespace=False)
    chapter_heading = StrictCharField(max_length=_TITLE_MAX_CHARS, trim_whitespace=False)
    closing = _text(required=False, allow_null=True)
    figures = serializers.BooleanField(required=False)


class MailSerializer(StrictSerializer):
    subject = StrictCharField(max_length=_TITLE_MAX_CHARS, trim_whitespace=False)
    body = _text()


class ReportTemplateSerializer(StrictSerializer):
    """One version of a template, as a client writes it. Every text is checked as a template a report may
    hold (jobs.kinds.report.templates.check_body) before anything is stored."""

    name = StrictRegexField(NAME.pattern, max_length=64)
    system = _text()
    synthesis = _text(required=False, allow_null=True)
    chapters = ChapterSerializer(many=True, allow_empty=False)
    max_output_tokens = StrictIntegerField(min_value=1, required=False)
    layout = LayoutSerializer(required=False)
    mail = MailSerializer(required=False)
    page_title = StrictCharField(max_length=_TITLE_MAX_CHARS, trim_whitespace=False, required=False)
    live = serializers.BooleanField(required=False, default=True)

    def validate_chapters(self, value):
        if len(value) > settings.REPORT_MAX_CHAPTERS:
            raise ValidationError(f"At most {settings.REPORT_MAX_CHAPTERS} chapters.")
        keys = [chapter["key"] for chapter in value]
        if len(set(keys)) != len(keys):
            raise ValidationError("Each chapter key once.")
        return value

    def validate_max_output_tokens(self, value):
        if value > settings.REPORT_TEMPLATE_MAX_OUTPUT_TOKENS:
            raise ValidationError(f"At most {settings.REPORT_TEMPLATE_MAX_OUTPUT_TOKENS}.")
        return value

    def validate(self, attrs):
        body = self.body(attrs)
        try:
            templates.check_body(body)
        except templates.TemplateProblem as problem:
            raise ValidationError({problem.field: [problem.message]}) from None
        return attrs

    @staticmethod
    def body(attrs: dict) -> dict:
        """What is stored: the version as written, without its name and the `live` switch."""
        return {key: value for key, value in attrs.items() if key not in ("name", "live")}


_CREATED = inline_serializer("ReportTemplateVersionCreated", {
    "name": serializers.CharField(), "version": serializers.IntegerField(), "live": serializers.BooleanField()})
_LISTED = inline_serializer("ReportTemplateSummary", {
    "name": serializers.CharField(), "live": serializers.IntegerField(), "versions": serializers.IntegerField()},
    many=True)
_VERSION = inline_serializer("ReportTemplateVersion", {
    "name": serializers.CharField(), "version": serializers.IntegerField(), "live": serializers.BooleanField(),
    "created_at": serializers.DateTimeField(), "system": serializers.CharField(),
    "synthesis": serializers.CharField(allow_null=True, required=False),
    "chapters": inline_serializer("ReportTemplateChapter", {
        "key": serializers.CharField(), "title": serializers.CharField(), "instruction": serializers.CharField()},
        many=True),
    "max_output_tokens": serializers.IntegerField(required=False), "layout": serializers.JSONField(required=False),
    "mail": serializers.JSONField(required=False), "page_title": serializers.CharField(required=False)})
_LIVE = inline_serializer("ReportTemplateLive", {"name": serializers.CharField(), "live": serializers.IntegerField()})

_EXAMPLE = {
    "name": "natal-chart", "system": "You write one chapter of a natal chart reading for {{ subject.name }}.",
    "synthesis": "Summarise the chart's main themes in three paragraphs.",
    "chapters": [{"key": "sun", "title": "Your Sun", "instruction": "Write about the Sun of {{ subject.name }}."},
                 {"key": "moon", "title": "Your Moon", "instruction": "Write about the Moon."}],
    "max_output_tokens": 1500,
    "layout": {"title": "The chart of {{ subject.name }}", "chapter_heading": "{{ chapter.title }}",
               "closing": "_Written for {{ subject.name }}._"},
    "mail": {"subject": "Your chart is ready", "body": "Read it here: {{ link }}"},
    "page_title": "Your natal chart"}


class ReportTemplateListCreateView(APIView):
    @extend_schema(operation_id="report_templates_create", request=ReportTemplateSerializer,
                   examples=[OpenApiExample("template", request_only=True, value=_EXAMPLE)],
                   responses={201: _CREATED, **dict.fromkeys((400, 401, 413, 415, 422), ERROR_SCHEMA)})
    def post(self, request):
        serializer = ReportTemplateSerializer(data=read_json_body(request))
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            version = templates.version_create(client=request.user, name=data["name"],
                                               body=ReportTemplateSerializer.body(data), live=data["live"])
        except templates.TooMany as exc:
            raise ValidationError({"name": [str(exc)]}) from None
        live = ReportTemplate.objects.values_list("live", flat=True).get(id=version.template_id)
        return Response({"name": data["name"], "version": version.number, "live": live == version.number}, status=201)

    @extend_schema(operation_id="report_templates_list", responses={200: _LISTED, 401: ERROR_SCHEMA})
    def get(self, request):
        return Response(templates.templates_of(client_id=request.user.id))


class ReportTemplateVersionView(APIView):
    @extend_schema(operation_id="report_templates_version", responses={200: _VERSION, 401: ERROR_SCHEMA, 404: ERROR_SCHEMA})
    def get(self, request, name: str, number: int):
        row = templates.version_row(client_id=request.user.id, name=name, number=number)
        if row is None:
            raise NotFound("Not found.")
        return Response({"name": name, "version": row.number, "live": row.template.live == row.number,
                         "created_at": row.created_at.isoformat().replace("+00:00", "Z"), **row.body})


class LiveSerializer(StrictSerializer):
    version = StrictIntegerField(min_value=1)


class ReportTemplateLiveView(APIView):
    @extend_schema(operation_id="report_templates_set_live", request=LiveSerializer,
                   responses={200: _LIVE, **dict.fromkeys((400, 401, 404, 413, 415, 422), ERROR_SCHEMA)})
    def post(self, request, name: str):
        serializer = LiveSerializer(data=read_json_body(request))
        serializer.is_valid(raise_exception=True)
        number = serializer.validated_data["version"]
        if templates.version_set_live(client=request.user, name=name, number=number) is None:
            raise NotFound("Not found.")
        return Response({"name": name, "live": number})
