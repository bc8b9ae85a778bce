# HCL2 variables, locals and functions, as Nomad evaluates them (docs/job-files.md).
#
#   drover job run deploy/examples/variables.nomad.hcl
#   drover job run -var env=prod -var replicas=3 deploy/examples/variables.nomad.hcl
#   NOMAD_VAR_env=prod drover job plan deploy/examples/variables.nomad.hcl
#
# ${node.unique.name} and ${NOMAD_ALLOC_ID} are not HCL variables: they are left as text
# for the client to fill in where the task runs. The mock driver keeps the example
# runnable on any dev agent.

variable "env" {
  type        = string
  default     = "dev"
  description = "the environment this copy of the service runs in"

  validation {
    condition     = contains(["dev", "staging", "prod"], var.env)
    error_message = "env must be dev, staging or prod"
  }
}

variable "replicas" {
  type    = number
  default = 1
}

variable "ports" {
  type    = list(number)
  default = [8080, 8443]
}

variable "labels" {
  type = map(string)
  default = {
    team = "web"
    tier = "frontend"
  }
}

locals {
  name      = "${var.env}-web"
  is_prod   = var.env == "prod"
  port_tags = [for p in var.ports : "port-${p}"]
  memory    = local.is_prod ? 64 : 32
  meta = merge(var.labels, {
    env      = upper(var.env)
    replicas = tostring(var.replicas)
    ports    = join(",", local.port_tags)
  })
}

job "variables-example" {
  type        = "service"
  datacenters = ["dc1"]
  meta        = local.meta

  group "web" {
    count = var.replicas

    task "app" {
      driver = "mock"

      config {
        run_for = local.is_prod ? "24h" : "1h"
      }

      env {
        SERVICE_NAME = local.name
        INSTANCE     = format("%s-%02d", local.name, length(var.ports))
        SETTINGS     = jsonencode({ ports = var.ports, prod = local.is_prod })
        WHERE        = "${node.unique.name}/${NOMAD_ALLOC_ID}"
      }

      resources {
        cpu    = 50
        memory = local.memory
      }
    }
  }
}
