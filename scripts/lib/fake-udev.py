"""An EC2 instance in moto and a fake udev for it (the AWS CI steps).

Usage: fake-udev.py PORT ROOT [INSTANCE_TYPE]. Runs one instance, prints
"INSTANCE_ID ZONE", then, until ROOT/stop exists (or 5 minutes pass), links
every volume attached in moto as ROOT/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_volXXX
to a sparse file of its size (as udev names EBS volumes on Nitro), and removes
the link of a detached one.
"""
import os
import sys
import time

import boto3

port, root = sys.argv[1], sys.argv[2]
kind = sys.argv[3] if len(sys.argv) > 3 else "m1.small"
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}")
i = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType=kind)["Instances"][0]
print(i["InstanceId"], i["Placement"]["AvailabilityZone"], flush=True)
os.makedirs(f"{root}/dev/disk/by-id", exist_ok=True)
deadline = time.time() + 300
while time.time() < deadline and not os.path.exists(f"{root}/stop"):
    for v in ec2.describe_volumes()["Volumes"]:
        vid = v["VolumeId"]
        link = f"{root}/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{vid.replace('-', '')}"
        if any(a["State"] == "attached" for a in v.get("Attachments", [])):
            data = f"{root}/dev/ebs-{vid}"
            if not os.path.exists(data):
                with open(data, "wb") as f:
                    f.truncate(v["Size"] << 30)
            if not os.path.islink(link):
                os.symlink(f"../../ebs-{vid}", link)
        elif os.path.islink(link):
            os.remove(link)
    time.sleep(0.05)
