// Package config owns Switchyard's configuration: the schema (Config and its sections),
// the defaults (Default), loading (Load, Decode), validation (Config.Validate) and the
// policy-resolution helper the engine factory uses (Config.EffectivePolicy).
//
// # Sources
//
// Load layers, in rising precedence: the defaults; the file named by --config (YAML for
// .yaml/.yml, JSON for .json); SWITCHYARD_ environment variables; command-line flags.
// The file, environment and simple key flags are merged with koanf and decoded by a
// strict decoder: an unknown key anywhere, or a value of the wrong type, is a *FieldError
// naming its full path, for example
//
//	models.llama.buckets[0].groups.pd.prefill.policy.admission.max_runing_requests: unknown key
//
// Environment variables use "__" between levels, since keys contain "_":
// SWITCHYARD_SERVER__PORT is server.port, SWITCHYARD_CACHE_AWARE__MIN_MATCHED_TOKENS is
// cache_aware.min_matched_tokens. Only scalar keys can be set that way; an unknown
// SWITCHYARD_ variable is an error.
//
// Flags that act on the decoded configuration (the --worker-urls/--model quick start,
// --policy, --prefill-policy, --decode-policy, --max-in-flight, --filter overloaded) are
// applied last. Dropped options (--policy fused_score, --fuse, --stable-pair, ...) are
// rejected with an ErrDropped error naming their replacement; so are dropped policy
// types in a file, by Validate.
//
// # Validation
//
// Load does not validate. Validate checks every rule (IDs, URLs, roles, bucket limits,
// plain XOR pd groups, membership, policy types and settings, section values) and returns
// every problem at once, joined with errors.Join; errors.Is matches ErrUnknownKey,
// ErrType, ErrInvalid and ErrDropped, errors.As a *FieldError.
//
// # Reference
//
// docs/config-reference.md is generated from this package by config/internal/docgen
// (`make docs`; `make docs-check` and a test fail when it is stale): keys and types from
// Config's koanf tags, meanings and defaults from the field comments, units from `unit`
// tags, flags from FlagKeys. Every field comment states its default ("Default 5s.",
// "Default: none." or "Required."); where Default holds the key, the generator checks that
// the stated default is the value.
//
// # Concurrency and ownership
//
// A Config is a plain value with no internal synchronization: build it once, validate
// it, then treat it as read-only (share it freely) or copy what you need. Default,
// Load and Decode return a fresh Config the caller owns; EffectivePolicy returns a deep
// copy. Nothing in the package holds state between calls or needs releasing.
package config
