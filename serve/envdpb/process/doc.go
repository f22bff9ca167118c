// Package processpb holds the messages of the envd Process service, generated
// from process.proto by `make proto`. The service is E2B's: sbx serve answers
// it so that E2B's SDKs run commands in sbx sandboxes unchanged.
package processpb
