// Package processpb holds the messages of the envd Process service, generated
// from process.proto by `make proto`. The service is E2B's: hutch serve answers
// it so that E2B's SDKs run commands in hutch sandboxes unchanged.
package processpb
