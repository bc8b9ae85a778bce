# A task whose files follow a service (docs/job-files.md, "Templates").
#
#   drover job run deploy/examples/service-consumer.nomad.hcl
#   drover job run deploy/examples/service-api.nomad.hcl   # the consumer restarts, one upstream
#   drover job stop service-api                           # and again, none
#   drover alloc logs <alloc-id> app
#
# The client renders both templates before the task starts, then watches the services they
# read: when "api-http" gains or loses an instance it renders again, and change_mode
# "restart" (the default) restarts the task. The env template's KEY=VALUE lines become
# the task's environment. Needs raw_exec (on in a dev agent).

job "service-consumer" {
  group "web" {
    task "app" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"start upstreams=$UPSTREAM_COUNT\"; cat local/upstreams.txt; exec sleep 600"]
      }

      template {
        data        = <<-EOT
          {{ range nomadService "api-http" -}}
          upstream {{ .Address }}:{{ .Port }} tags={{ join "," .Tags }}
          {{ end -}}
        EOT
        destination = "local/upstreams.txt"
        change_mode = "restart"
      }

      template {
        data        = "UPSTREAM_COUNT={{ len (nomadService \"api-http\") }}\n"
        destination = "local/upstreams.env"
        env         = true
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
