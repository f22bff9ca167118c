// Package filesystempb holds the messages of the envd Filesystem service,
// generated from filesystem.proto by `make proto`. The service is E2B's: hutch
// serve answers it so that E2B's SDKs reach files in hutch sandboxes unchanged.
package filesystempb
