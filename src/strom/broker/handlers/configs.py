"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44) for topics and the broker.

Topic configs are stored as overrides in the control plane; the effective value of
every other config comes from the broker's synonym or Kafka's default, and
DescribeConfigs reports which source won. Broker configs come from server.properties and
--override, overlaid by dynamic configs of the cluster default (resource name "") and of
this broker (its id), which AlterConfigs and IncrementalAlterConfigs change as Kafka does
(strom.broker.dynamic_config); keys that cannot change at runtime are refused with
INVALID_REQUEST and Kafka's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strom.broker.config import BROKER_CONFIGS
from strom.broker.control_plane.plane import ZooKeeperUnavailableError
from strom.broker.dispatcher import RequestContext
from strom.broker.dynamic_config import DynamicConfigRefused
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import KafkaStorageError
from strom.storage.log_config import (
    TOPIC_CONFIGS,
    ConfigType,
    InvalidConfigError,
    LogConfig,
    describe_topic_config,
)

TOPIC = 2
BROKER = 4

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


class ConfigRequestError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def _describe_resource(ctx: RequestContext, resource: Any, include_synonyms: bool, include_docs: bool) -> Any:
    r = ctx.response
    broker = ctx.broker
    try:
        if resource.resource_type == TOPIC:
            topic = broker.control_plane.image.topic(resource.resource_name)
            if topic is None:
                raise ConfigRequestError(
                    ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist"
                )
            entries = describe_topic_config(
                topic.configs, broker.config.log_config_defaults(), broker.config.log_config_sources()
            )
        elif resource.resource_type == BROKER:
            if resource.resource_name == "":
                entries = broker.config.describe_cluster_default()
            elif resource.resource_name == str(broker.node_id):
                entries = broker.config.describe()
            else:
                raise ConfigRequestError(
                    ErrorCode.invalid_request,
                    f"Unexpected broker id, expected {broker.node_id} or empty string, "
                    f"but received {resource.resource_name}",
                )
        else:
            raise ConfigRequestError(
                ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
            )
    except ConfigRequestError as exc:
        return build(
            r.DescribeConfigsResult,
            error_code=exc.error,
            error_message=str(exc),
            resource_type=resource.resource_type,
            resource_name=resource.resource_name,
            configs=(),
        )
    keys = set(resource.configuration_keys) if resource.configuration_keys is not None else None
    configs = tuple(
        build(
            r.DescribeConfigsResourceResult,
            name=e.name,
            value=e.value,
            read_only=e.read_only,
            config_source=e.source,
            is_default=e.source == 5,
            is_sensitive=e.is_sensitive,
            synonyms=tuple(
                build(r.DescribeConfigsSynonym, name=s.name, value=s.value, source=s.source)
                for s in e.synonyms
            )
            if include_synonyms
            else (),
            config_type=e.config_type,
            documentation=e.documentation if include_docs else None,
        )
        for e in entries
        if keys is None or e.name in keys
    )
    return build(
        r.DescribeConfigsResult,
        error_code=ErrorCode.none,
        error_message=None,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        configs=configs,
    )


async def handle_describe_configs(ctx: RequestContext, request: Any) -> Any:
    include_synonyms = getattr(request, "include_synonyms", False)
    include_docs = getattr(request, "include_documentation", False)
    results = tuple(_describe_resource(ctx, res, include_synonyms, include_docs) for res in request.resources)
    return build(ctx.response.DescribeConfigsResponse, results=results)


async def _apply_topic_configs(
    ctx: RequestContext, name: str, configs: Mapping[str, str], validate_only: bool
) -> None:
    broker = ctx.broker
    if broker.control_plane.image.topic(name) is None:
        raise ConfigRequestError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
    try:
        LogConfig.from_props(configs, broker.config.log_config_defaults())
    except InvalidConfigError as exc:
        raise ConfigRequestError(ErrorCode.invalid_config, str(exc)) from exc
    if not validate_only:
        try:
            await broker.control_plane.set_topic_configs(name, configs)
        except KeyError as exc:  # deleted meanwhile
            raise ConfigRequestError(
                ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist"
            ) from exc
        except KafkaStorageError as exc:
            raise ConfigRequestError(ErrorCode.kafka_storage_error, str(exc)) from exc
        except ZooKeeperUnavailableError as exc:
            raise ConfigRequestError(ErrorCode.request_timed_out, str(exc)) from exc


async def _alter_broker(
    ctx: RequestContext, resource: Any, ops: Any, incremental: bool, validate_only: bool
) -> None:
    """A BROKER resource: this broker ("<id>") or the cluster default ("")."""
    dynamic = ctx.broker.dynamic_config
    try:
        entity = dynamic.entity_of(resource.resource_name)
        if incremental:
            configs = dynamic.current(entity)
            for c in ops:
                _incremental_broker(configs, c.config_operation, c.name, c.value)
        else:
            configs = {c.name: c.value for c in ops if c.value is not None}
        await dynamic.alter(entity, configs, validate_only)
    except DynamicConfigRefused as exc:
        raise ConfigRequestError(ErrorCode.invalid_request, str(exc)) from exc
    except OSError as exc:
        raise ConfigRequestError(
            ErrorCode.kafka_storage_error, f"Storing broker configs failed: {exc}"
        ) from exc


def _incremental_broker(current: dict[str, str], op: int, name: str, value: str | None) -> None:
    """One IncrementalAlterConfigs operation on a broker entity's dynamic configs."""
    definition = BROKER_CONFIGS.get(name)
    if op == SET:
        if value is None:
            raise ConfigRequestError(ErrorCode.invalid_config, f"Null value not supported for {name}")
        current[name] = value
    elif op == DELETE:
        current.pop(name, None)
    elif op in (APPEND, SUBTRACT):
        if definition is None or definition.type is not ConfigType.LIST:
            raise ConfigRequestError(
                ErrorCode.invalid_config, f"Config value append is not allowed for config key: {name}"
            )
        existing = current.get(name, definition.default or "")
        items = [v for v in existing.split(",") if v]
        delta = [v.strip() for v in (value or "").split(",") if v.strip()]
        items = (
            items + [v for v in delta if v not in items]
            if op == APPEND
            else [v for v in items if v not in delta]
        )
        current[name] = ",".join(items)
    else:
        raise ConfigRequestError(ErrorCode.invalid_request, f"Unknown config operation {op}")


def _refuse_broker(ctx: RequestContext, resource: Any) -> None:
    if resource.resource_type != TOPIC:
        raise ConfigRequestError(
            ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
        )


def _alter_response(ctx: RequestContext, resource: Any, error: ErrorCode, message: str | None) -> Any:
    return build(
        ctx.response.AlterConfigsResourceResponse,
        error_code=error,
        error_message=message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
    )


async def handle_alter_configs(ctx: RequestContext, request: Any) -> Any:
    """AlterConfigs replaces a topic's whole set of overrides with the given one."""
    responses = []
    for resource in request.resources:
        error, message = ErrorCode.none, None
        try:
            if resource.resource_type == BROKER:
                await _alter_broker(ctx, resource, resource.configs, False, request.validate_only)
                responses.append(_alter_response(ctx, resource, error, message))
                continue
            _refuse_broker(ctx, resource)
            configs = {c.name: c.value for c in resource.configs if c.value is not None}
            await _apply_topic_configs(ctx, resource.resource_name, configs, request.validate_only)
        except ConfigRequestError as exc:
            error, message = exc.error, str(exc)
        responses.append(_alter_response(ctx, resource, error, message))
    return build(ctx.response.AlterConfigsResponse, responses=tuple(responses))


def _incremental(current: dict[str, str], op: int, name: str, value: str | None) -> None:
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise ConfigRequestError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
    if op == SET:
        if value is None:
            raise ConfigRequestError(ErrorCode.invalid_config, f"Null value not supported for {name}")
        current[name] = value
    elif op == DELETE:
        current.pop(name, None)
    elif op in (APPEND, SUBTRACT):
        if definition.type != "LIST":
            raise ConfigRequestError(
                ErrorCode.invalid_config, f"Config value append is not allowed for config key: {name}"
            )
        existing = current.get(name, definition.default_string() or "")
        items = [v for v in existing.split(",") if v]
        delta = [v.strip() for v in (value or "").split(",") if v.strip()]
        if op == APPEND:
            items += [v for v in delta if v not in items]
        else:
            items = [v for v in items if v not in delta]
        current[name] = ",".join(items)
    else:
        raise ConfigRequestError(ErrorCode.invalid_request, f"Unknown config operation {op}")


async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> Any:
    responses = []
    for resource in request.resources:
        error, message = ErrorCode.none, None
        try:
            if resource.resource_type == BROKER:
                await _alter_broker(ctx, resource, resource.configs, True, request.validate_only)
                responses.append(_alter_response(ctx, resource, error, message))
                continue
            _refuse_broker(ctx, resource)
            topic = ctx.broker.control_plane.image.topic(resource.resource_name)
            if topic is None:
                raise ConfigRequestError(
                    ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist"
                )
            configs = dict(topic.configs)
            for c in resource.configs:
                _incremental(configs, c.config_operation, c.name, c.value)
            await _apply_topic_configs(ctx, resource.resource_name, configs, request.validate_only)
        except ConfigRequestError as exc:
            error, message = exc.error, str(exc)
        responses.append(_alter_response(ctx, resource, error, message))
    return build(ctx.response.IncrementalAlterConfigsResponse, responses=tuple(responses))
