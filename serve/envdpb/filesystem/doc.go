// Package filesystempb holds the messages of the envd Filesystem service,
// generated from filesystem.proto by `make proto`. The service is E2B's: sbx
// serve answers it so that E2B's SDKs reach files in sbx sandboxes unchanged.
package filesystempb
